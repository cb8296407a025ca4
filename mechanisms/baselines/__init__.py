"""Baseline mechanisms the CorBin-FL experiments compare against.

Every function clips ``w`` into ``[c - r, c + r]`` first (per element or per layer ``c, r``;
sensitivity ``2 r`` per parameter), runs in ``float32`` on the tensors' device, and draws its
randomness from an injected ``torch.Generator`` (a CSPRNG-seeded one when ``None``).

========================  ==================================================================
module                    mechanism
========================  ==================================================================
:mod:`.gaussian`          ``w + N(0, sigma^2)``, analytic Gaussian (Balle & Wang 2018)
:mod:`.laplace`           ``w + Laplace(2 r / eps)`` (Dwork et al. 2006)
:mod:`.vanilla`           identity, FedAvg (no clipping by default)
:mod:`.cq`                one-bit correlated quantization without privacy (Suresh et al. 2022)
:mod:`.ternary`           ternary stochastic compressor (f-DP paper, Definition 6)
:mod:`.fedcad`            Fed-CAD correlated Gaussian noise on updates (stateful)
:mod:`.levels`            finite-output mechanisms: K symbols of b bits, exact pure eps
:mod:`.pbm`               Poisson binomial mechanism, m trials (Chen et al. 2022)
:mod:`.rqm`               randomized quantization mechanism, 2 or 3 levels (Youn et al. 2023)
:mod:`.imvu`              interpolated minimum-variance unbiased, 1/2/4 bits (Guo et al. 2023)
:mod:`.signsgd`           sign of the update, majority vote (Bernstein et al. 2019; no DP)
:mod:`.central_gaussian`  clipped update, the server's Gaussian noise (DP-FedAvg; central DP)
========================  ==================================================================

Import each from its module (``from corbin_fl.mechanisms.baselines.pbm import PBM``): this
package re-exports nothing, so that importing one baseline imports no other (and no torch where
the one imported needs none), and no file but a mechanism's own names it.
"""
