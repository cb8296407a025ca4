"""Models of the paper's experiments (this project's task; the flat view is ``corbin_fl.layout``).

Models (paper, Sec. V-2): "ResNet18 [...] for experiments over the CIFAR10 dataset and small
(two-layers) VGG [...] for experiments over the MNIST dataset."

* :class:`SmallCNN` -- two VGG blocks (3x3 conv, ReLU, 2x2 max-pool; 32 and 64 channels), then
  FC 128, ReLU, FC ``num_classes``. An adaptive average pool to 7 x 7 before the classifier (as in
  VGG) makes it accept 28 x 28 and 32 x 32 inputs alike; for 28 x 28 it is the identity.
* :class:`ResNet18` -- the CIFAR variant of He et al. (2016): 3x3 stem convolution with stride 1
  and no max-pool, BasicBlocks ``[2, 2, 2, 2]`` with 64, 128, 256, 512 channels, BatchNorm,
  global average pool, FC. 11,173,962 parameters for 3 channels and 10 classes.

Seeded initialisation. :func:`build_model` constructs the module on the ``meta`` device (no
memory, no random draws) and then initialises every parameter and buffer on the CPU from an
explicit ``torch.Generator`` (:func:`init_parameters`), so the global RNG is never touched and the
server and every client obtain bit-identical initial weights from the run seed. All draws are
float32 uniforms (24-bit integers times ``2**-24``, exact) mapped to ``[-b, b)`` with a single
rounding, which does not depend on the CPU's vector unit.
"""

from __future__ import annotations

import logging
import math
import secrets

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from corbin_fl.mechanisms.validate import require, why_at_least

logger = logging.getLogger(__name__)

__all__ = [
    "MODEL_NAMES",
    "BasicBlock",
    "ResNet18",
    "SmallCNN",
    "build_model",
    "init_parameters",
]

#: Names accepted by :func:`build_model`.
MODEL_NAMES: tuple[str, ...] = ("cnn", "resnet18", "char-lstm")


# --------------------------------------------------------------------------- models
class SmallCNN(nn.Module):
    """Small two-block VGG-style CNN (the paper's MNIST model).

    ``x -> [conv3x3(C->32), ReLU, maxpool2] -> [conv3x3(32->64), ReLU, maxpool2]
    -> adaptive avg-pool 7x7 -> flatten(64*7*7) -> FC(3136->128), ReLU -> FC(128->K)``.
    421,642 parameters for ``C = 1``, ``K = 10``.

    Parameters
    ----------
    in_channels : int
        Input channels ``C``.
    num_classes : int
        Output logits ``K``.
    widths : tuple of int
        Channels of the two convolution blocks.
    hidden : int
        Width of the hidden fully connected layer.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        widths: tuple[int, int] = (32, 64),
        hidden: int = 128,
    ) -> None:
        super().__init__()
        c1, c2 = widths
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.pool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c2 * 7 * 7, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``N x K`` of images ``N x C x H x W`` (``H, W >= 4``)."""
        h = self.features(x)
        if h.shape[-2:] != (7, 7):  # 28 x 28 inputs are already 7 x 7: skip the no-op pool
            h = self.pool(h)
        return self.classifier(h)


class BasicBlock(nn.Module):
    """ResNet basic block: ``relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x))``.

    The shortcut is the identity, or ``bn(conv1x1(x, stride))`` when the stride or the number of
    channels changes (option B of He et al., 2016).

    Parameters
    ----------
    in_planes, planes : int
        Input and output channels.
    stride : int
        Stride of the first convolution and of the projection shortcut.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Block output, ``planes`` channels, spatial size divided by ``stride``."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet18 (the paper's CIFAR-10 model).

    Stem ``conv3x3(C->64, stride 1) -> BN -> ReLU`` (no max-pool), four stages of two
    :class:`BasicBlock` each (64, 128, 256, 512 channels; strides 1, 2, 2, 2), global average
    pool, ``FC(512->K)``.

    Parameters
    ----------
    in_channels : int
        Input channels ``C``.
    num_classes : int
        Output logits ``K``.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages: list[nn.Sequential] = []
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1))
            )
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``N x K`` of images ``N x C x H x W``."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.fc(torch.flatten(self.pool(out), 1))


# --------------------------------------------------------------------------- initialisation
class CharLSTM(nn.Module):
    """LEAF's next-character model for Shakespeare (Caldas et al. 2018, arXiv:1812.01097).

    ``letters (B x L) -> embedding(K -> 8) -> 2-layer LSTM(256) -> last step -> FC(256 -> K)``,
    ``K`` the alphabet, which is also the set of classes (the next letter). 819,920 parameters
    for ``K = 80``.

    Parameters
    ----------
    num_classes : int
        ``K``.
    """

    def __init__(self, num_classes: int, embedding: int = 8, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_classes, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))
        return self.head(out[:, -1, :])


def _uniform_(t: torch.Tensor, bound: float, generator: torch.Generator) -> None:
    """Fill ``t`` with ``U(-bound, bound)`` as ``(2u - 1) * bound``.

    ``u = k * 2**-24`` with ``k`` a 24-bit integer from the CPU generator (exact in float32), so
    ``2u - 1`` is exact too and only the final product rounds, once, under IEEE 754: the result
    is the same on every machine.
    """
    u = torch.rand(t.shape, generator=generator, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        t.copy_(u.mul_(2.0).sub_(1.0).mul_(bound))


def init_parameters(model: nn.Module, generator: torch.Generator) -> None:
    """(Re-)initialise every parameter and buffer of ``model`` from ``generator``.

    * ``Conv2d`` weight: ``U(-b, b)``, ``b = sqrt(6 / fan_out)``, i.e. variance
      ``2 / fan_out`` (He et al. 2015 with the ReLU gain, ``fan_out = out_ch * kh * kw``, the
      rule torchvision's ResNet uses); bias: 0.
    * ``Linear`` weight and bias: ``U(-b, b)``, ``b = 1 / sqrt(fan_in)`` (PyTorch's default law).
    * BatchNorm: weight 1, bias 0, running mean 0, running variance 1, batch count 0.
    * ``Embedding``: ``N(0, 1)``; ``LSTM`` weights and biases: ``U(-b, b)``,
      ``b = 1 / sqrt(hidden)`` (PyTorch's default laws).

    Parameters
    ----------
    model : torch.nn.Module
        Its tensors must live on the CPU (build on CPU, move afterwards).
    generator : torch.Generator
        A CPU generator; consumed in module order.

    Raises
    ------
    TypeError
        ``generator`` is not a CPU ``torch.Generator``, or the model contains a module with
        parameters or buffers of a type this function does not know how to initialise.
    ValueError
        A tensor of the model is not on the CPU.
    """
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != "cpu":
        raise TypeError(f"generator must be a CPU generator, got one on {generator.device}")
    for t in [*model.parameters(), *model.buffers()]:
        if t.device.type != "cpu":
            raise ValueError(f"init_parameters needs CPU tensors, found one on {t.device}")
    for name, module in model.named_modules():
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if isinstance(module, nn.Conv2d):
            fan_out = module.out_channels * math.prod(module.kernel_size)
            _uniform_(module.weight, math.sqrt(6.0 / fan_out), generator)
            if module.bias is not None:
                with torch.no_grad():
                    module.bias.zero_()
        elif isinstance(module, nn.Linear):
            bound = 1.0 / math.sqrt(module.in_features)
            _uniform_(module.weight, bound, generator)
            if module.bias is not None:
                _uniform_(module.bias, bound, generator)
        elif isinstance(module, _BatchNorm):
            module.reset_parameters()
        elif isinstance(module, nn.Embedding):  # PyTorch's law, N(0, 1), from the generator
            with torch.no_grad():
                module.weight.copy_(
                    torch.randn(module.weight.shape, generator=generator, dtype=torch.float32)
                )
        elif isinstance(module, nn.LSTM):  # PyTorch's law: U(-b, b), b = 1 / sqrt(hidden)
            bound = 1.0 / math.sqrt(module.hidden_size)
            for p in module.parameters(recurse=False):
                _uniform_(p, bound, generator)
        elif own:
            raise TypeError(
                f"init_parameters does not know how to initialise {name or 'the model'} "
                f"({type(module).__name__})"
            )


def build_model(
    name: str,
    in_channels: int,
    num_classes: int,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> nn.Module:
    """Build a model with a reproducible initialisation.

    Parameters
    ----------
    name : {"cnn", "resnet18"}
        :class:`SmallCNN` or :class:`ResNet18`.
    in_channels : int
        Image channels (1 for MNIST, 3 for CIFAR-10).
    num_classes : int
        ``>= 2``.
    seed : int, optional
        Initialisation seed (``0 <= seed < 2**64``); the same seed gives bit-identical weights
        in every process. Mutually exclusive with ``generator``.
    generator : torch.Generator, optional
        A CPU generator to draw the initialisation from instead of ``seed``.
    device : torch.device or str, optional
        Where to put the model afterwards (default: CPU).

    Returns
    -------
    torch.nn.Module
        In training mode. With neither ``seed`` nor ``generator`` the seed is drawn from the
        operating system's CSPRNG (``secrets``) and logged.

    Raises
    ------
    TypeError, ValueError
        Unknown name, non-integer or out-of-range sizes or seed, both ``seed`` and ``generator``.
    """
    model = empty_model(name, in_channels, num_classes)
    if seed is not None and generator is not None:
        raise ValueError("pass either seed or generator, not both")
    if generator is None:
        if seed is None:
            seed = secrets.randbits(63)
            logger.info("build_model(%s): no seed given, drew %d from the OS CSPRNG", name, seed)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)
    init_parameters(model, generator)
    if device is not None:
        model = model.to(torch.device(device))
    return model


def empty_model(name: str, in_channels: int, num_classes: int) -> nn.Module:
    """The model's skeleton on the CPU with uninitialised memory (no initialisation cost).

    For a process that overwrites every entry at once with ``load_state_dict(strict=True)``
    (a client loading the global model): ResNet18's seeded initialisation alone takes 0.3-0.8 s
    of CPU, paid in every ClientApp process. Never use it before such a load.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES}")
    for arg, value, low in (("in_channels", in_channels, 1), ("num_classes", num_classes, 2)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{arg} must be an int, got {type(value).__name__}")
        require(arg, why_at_least(value, low))
    if name == "char-lstm":  # letters in, letters out: in_channels is not used
        # On the meta device its embedding's normal_ runs torch's Python reference, which
        # imports torch._dynamo (seconds); its own initialisation on the CPU takes milliseconds
        # (it draws from torch's global generator, whose state is restored afterwards).
        with torch.random.fork_rng(devices=[]):
            return CharLSTM(num_classes)
    cls = SmallCNN if name == "cnn" else ResNet18
    with torch.device("meta"):
        model: nn.Module = cls(in_channels=in_channels, num_classes=num_classes)
    return _materialize_on_cpu(model)


def _materialize_on_cpu(model: nn.Module) -> nn.Module:
    """Give every parameter and buffer of a meta-device ``model`` uninitialised CPU memory.

    ``Module.to_empty`` does the same through ``torch.empty_like`` on meta tensors, whose Python
    reference implementation imports SymPy and ``torch.fx``'s symbolic shapes: 1.0-1.5 s in every
    fresh ClientApp process, against milliseconds for ``torch.empty`` of the same shapes.
    """
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            module._parameters[name] = nn.Parameter(
                torch.empty(param.shape, dtype=param.dtype), requires_grad=param.requires_grad
            )
        for name, buf in list(module.named_buffers(recurse=False)):
            module._buffers[name] = torch.empty(buf.shape, dtype=buf.dtype)
    return model
