"""Tests of corbin_fl.app.models: architectures, seeded init, the flat view and layer statistics."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from corbin_fl import layout as flat
from corbin_fl.app import models


# --------------------------------------------------------------------------- formulas
def conv(cin: int, cout: int, k: int, bias: bool = False) -> int:
    return cin * cout * k * k + (cout if bias else 0)


def bn(c: int) -> int:
    return 2 * c  # weight and bias (running stats are buffers)


def resnet18_params(in_channels: int, num_classes: int) -> tuple[int, int]:
    """(parameters, BatchNorm channels) of the CIFAR ResNet18, from the architecture."""
    params = conv(in_channels, 64, 3) + bn(64)
    bn_channels = 64
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            s = stride if block == 0 else 1
            params += conv(cin, cout, 3) + bn(cout) + conv(cout, cout, 3) + bn(cout)
            bn_channels += 2 * cout
            if s != 1 or cin != cout:
                params += conv(cin, cout, 1) + bn(cout)
                bn_channels += cout
            cin = cout
    params += 512 * num_classes + num_classes
    return params, bn_channels


def small_cnn_params(in_channels: int, num_classes: int) -> int:
    return (
        conv(in_channels, 32, 3, bias=True)
        + conv(32, 64, 3, bias=True)
        + (64 * 7 * 7 * 128 + 128)
        + (128 * num_classes + num_classes)
    )


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    return models.build_model("resnet18", 3, 10, seed=123)


# --------------------------------------------------------------------------- architectures
def test_resnet18_parameter_count_and_layout(resnet: nn.Module) -> None:
    params, bn_channels = resnet18_params(3, 10)
    assert params == 11_173_962
    assert sum(p.numel() for p in resnet.parameters()) == params
    layout = flat.layout_of(resnet)
    # float buffers (running mean and variance) are part of the flat vector, the counters not
    assert layout.m == params + 2 * bn_channels
    assert not any(name.endswith("num_batches_tracked") for name in layout.names)
    assert layout.offsets[0] == 0
    for i in range(1, layout.num_layers):
        assert layout.offsets[i] == layout.offsets[i - 1] + layout.sizes[i - 1]
    assert layout.sizes == tuple(math.prod(s) for s in layout.shapes)
    assert list(layout.names) == [
        k for k, v in resnet.state_dict().items() if v.is_floating_point()
    ]


def test_forward_shapes(resnet: nn.Module) -> None:
    resnet.eval()
    with torch.no_grad():
        assert resnet(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    resnet.train()
    cnn = models.build_model("cnn", 1, 10, seed=0)
    assert sum(p.numel() for p in cnn.parameters()) == small_cnn_params(1, 10) == 421_642
    assert cnn(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    cnn3 = models.build_model("cnn", 3, 7, seed=0)
    assert sum(p.numel() for p in cnn3.parameters()) == small_cnn_params(3, 7)
    assert cnn3(torch.zeros(2, 3, 32, 32)).shape == (2, 7)  # 8x8 features pooled to 7x7
    with torch.device("meta"):  # counting needs no memory nor initialisation
        r1 = models.ResNet18(in_channels=1, num_classes=100)
    assert sum(p.numel() for p in r1.parameters()) == resnet18_params(1, 100)[0]


# --------------------------------------------------------------------------- seeded init
def test_identical_init_from_same_seed(resnet: nn.Module) -> None:
    before = torch.random.get_rng_state()
    again = models.build_model("resnet18", 3, 10, seed=123)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is untouched
    assert torch.equal(flat.flatten(again), flat.flatten(resnet))
    a = models.build_model("cnn", 1, 10, seed=5)
    g = torch.Generator().manual_seed(5)
    b = models.build_model("cnn", 1, 10, generator=g)
    c = models.build_model("cnn", 1, 10, seed=6)
    assert torch.equal(flat.flatten(a), flat.flatten(b))
    diff = flat.flatten(a) != flat.flatten(c)
    # every randomly drawn weight differs (biases of the convolutions are zero in both)
    assert int(diff.sum()) > 0.99 * (421_642 - 32 - 64)


def test_unseeded_builds_differ() -> None:
    a = flat.flatten(models.build_model("cnn", 1, 10))
    b = flat.flatten(models.build_model("cnn", 1, 10))
    assert not torch.equal(a, b)


def test_init_distribution(resnet: nn.Module) -> None:
    """Conv weights ~ U(-b, b) with b = sqrt(6 / fan_out); BN at identity; FC at PyTorch law."""
    w = resnet.layer4[1].conv2.weight.detach().double().reshape(-1)  # 512 x 512 x 3 x 3
    n = w.numel()
    b = math.sqrt(6.0 / (512 * 9))
    var = b * b / 3
    assert float(w.abs().max()) <= b
    # mean: sd sqrt(var / n); second moment: Var(X^2) = E X^4 - (E X^2)^2 = b^4/5 - b^4/9
    assert abs(float(w.mean())) < 5 * math.sqrt(var / n)
    se_m2 = math.sqrt((b**4 / 5 - b**4 / 9) / n)
    assert abs(float((w * w).mean()) - var) < 5 * se_m2
    bn1 = resnet.bn1
    assert torch.all(bn1.weight == 1) and torch.all(bn1.bias == 0)
    assert torch.all(bn1.running_mean == 0) and torch.all(bn1.running_var == 1)
    assert float(resnet.fc.weight.detach().abs().max()) <= 1 / math.sqrt(512)


def test_build_model_validation() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        models.build_model("vgg16", 1, 10, seed=0)
    with pytest.raises(ValueError, match="not both"):
        models.build_model("cnn", 1, 10, seed=0, generator=torch.Generator())
    with pytest.raises(ValueError, match="num_classes"):
        models.build_model("cnn", 1, 1, seed=0)
    with pytest.raises(TypeError, match="in_channels"):
        models.build_model("cnn", 1.0, 10, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        models.build_model("cnn", 1, 10, seed=-1)
    with pytest.raises(TypeError, match="generator"):
        models.init_parameters(nn.Linear(2, 2), generator=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="does not know"):
        models.init_parameters(nn.Sequential(nn.LayerNorm(4)), torch.Generator())


# --------------------------------------------------------------------------- flat view
def test_flatten_load_flat_round_trip() -> None:
    a = models.build_model("cnn", 1, 10, seed=1)
    b = models.build_model("cnn", 1, 10, seed=2)
    va = flat.flatten(a)
    assert va.dtype == torch.float32 and va.shape == (flat.layout_of(a).m,)
    flat.load_flat(b, va)
    assert torch.equal(flat.flatten(b), va)
    for (ka, ta), (kb, tb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(ta, tb)
    # the flat vector is a copy, not a view
    va.add_(1.0)
    assert not torch.equal(flat.flatten(a), va)


def test_flat_view_includes_batchnorm_statistics(resnet: nn.Module) -> None:
    model = copy.deepcopy(resnet)
    layout = flat.layout_of(model)
    before = flat.flatten(model)
    counter = model.bn1.num_batches_tracked.clone()
    model(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)))  # train mode
    after = flat.flatten(model)
    i = layout.names.index("bn1.running_mean")
    sl = slice(layout.offsets[i], layout.offsets[i] + layout.sizes[i])
    assert not torch.equal(before[sl], after[sl])
    flat.load_flat(model, before)
    assert torch.equal(flat.flatten(model), before)
    assert int(model.bn1.num_batches_tracked) == int(counter) + 1  # integer buffers untouched


def test_load_flat_validation() -> None:
    model = models.build_model("cnn", 1, 10, seed=3)
    vec = flat.flatten(model)
    with pytest.raises(ValueError, match="shape"):
        flat.load_flat(model, vec[:-1])
    with pytest.raises(ValueError, match="shape"):
        flat.load_flat(model, vec.view(1, -1))
    with pytest.raises(TypeError, match="floating-point"):
        flat.load_flat(model, vec.to(torch.int32))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        flat.load_flat(model, vec.numpy())  # type: ignore[arg-type]
    bad = vec.clone()
    bad[7] = float("nan")
    bad[9] = float("inf")
    with pytest.raises(ValueError, match="2 non-finite"):
        flat.load_flat(model, bad)
    assert torch.equal(flat.flatten(model), vec)  # unchanged after a rejected load
    flat.load_flat(model, vec.double())  # other float dtypes are converted
    assert torch.equal(flat.flatten(model), vec)


# --------------------------------------------------------------------------- layer statistics
def hand_layout() -> flat.ParamLayout:
    return flat.ParamLayout(
        names=("a", "b", "c"),
        shapes=((3,), (2,), (1,)),
        offsets=(0, 3, 5),
        sizes=(3, 2, 1),
        m=6,
    )


def test_param_layout_validation() -> None:
    good = {"names": ("a", "b"), "shapes": ((2, 2), (3,)), "offsets": (0, 4), "sizes": (4, 3)}
    assert flat.ParamLayout(**good, m=7).num_layers == 2
    with pytest.raises(ValueError, match="m = 8"):
        flat.ParamLayout(**good, m=8)
    with pytest.raises(ValueError, match="offset 5"):
        flat.ParamLayout(**(good | {"offsets": (0, 5)}), m=7)
    with pytest.raises(ValueError, match="does not match shape"):
        flat.ParamLayout(**(good | {"sizes": (3, 3)}), m=6)
    with pytest.raises(ValueError, match="unique"):
        flat.ParamLayout(**(good | {"names": ("a", "a")}), m=7)
    with pytest.raises(ValueError, match="same length"):
        flat.ParamLayout(**(good | {"sizes": (4,)}), m=4)


def test_layer_ids_and_expand() -> None:
    layout = hand_layout()
    ids = flat.layer_ids(layout)
    assert ids.dtype == torch.int64 and ids.tolist() == [0, 0, 0, 1, 1, 2]
    vals = torch.tensor([10.0, 20.0, 30.0])
    out = flat.expand_per_element(vals, layout)
    assert out.tolist() == [10.0, 10.0, 10.0, 20.0, 20.0, 30.0]
    assert torch.equal(out, vals[ids])
    assert flat.expand_per_element([1.0, 2.0, 3.0], layout).tolist() == [1, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        flat.expand_per_element(torch.ones(2), layout)


def test_layer_center_radius_hand_made() -> None:
    layout = hand_layout()
    vec = torch.tensor([1.0, -3.0, 2.0, 5.0, 5.0, 0.5])
    c, r = flat.layer_center_radius(vec, layout)
    assert c.tolist() == [-0.5, 5.0, 0.5]
    assert r.tolist() == pytest.approx([2.5, 1e-3, 1e-3])
    c2, r2 = flat.layer_center_radius(vec, layout, margin=0.2, min_radius=0.25)
    assert c2.tolist() == [-0.5, 5.0, 0.5]
    assert r2.tolist() == pytest.approx([3.0, 0.25, 0.25])
    # every element lies in its layer's interval
    lo = flat.expand_per_element(c - r, layout)
    hi = flat.expand_per_element(c + r, layout)
    assert torch.all(lo <= vec) and torch.all(vec <= hi)
    with pytest.raises(ValueError, match="margin"):
        flat.layer_center_radius(vec, layout, margin=-0.1)
    with pytest.raises(ValueError, match="min_radius"):
        flat.layer_center_radius(vec, layout, min_radius=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        flat.layer_center_radius(torch.tensor([1.0, float("nan"), 0, 0, 0, 0]), layout)
    with pytest.raises(ValueError, match="shape"):
        flat.layer_center_radius(vec[:5], layout)


def test_layer_center_radius_inner_quantile_ignores_outliers() -> None:
    """``quantile = q`` uses the order statistics ``floor((1-q) n) + 1`` and ``ceil(q n)``."""
    layout = flat.ParamLayout(names=("a",), shapes=((100,),), offsets=(0,), sizes=(100,), m=100)
    vec = torch.linspace(-1.0, 1.0, 100)
    vec[0], vec[99] = -40.0, 25.0  # two noise outliers
    c, r = flat.layer_center_radius(vec, layout)
    assert float(c[0]) == pytest.approx(-7.5) and float(r[0]) == pytest.approx(32.5)
    cq, rq = flat.layer_center_radius(vec, layout, quantile=0.98)
    ordered = torch.sort(vec).values
    lo, hi = float(ordered[2]), float(ordered[97])  # 3rd smallest and 98th smallest
    assert float(cq[0]) == pytest.approx((lo + hi) / 2)
    assert float(rq[0]) == pytest.approx((hi - lo) / 2)
    assert float(rq[0]) < 1.0
    same = flat.layer_center_radius(vec, layout, quantile=1.0)
    assert torch.equal(same[0], c) and torch.equal(same[1], r)
    for bad in (0.5, 1.01):
        with pytest.raises(ValueError, match="quantile"):
            flat.layer_center_radius(vec, layout, quantile=bad)


def test_layer_center_radius_matches_model_layers() -> None:
    model = models.build_model("cnn", 1, 10, seed=4)
    layout = flat.layout_of(model)
    c, r = flat.layer_center_radius(flat.flatten(model), layout)
    state = model.state_dict()
    for i, name in enumerate(layout.names):
        t = state[name]
        assert float(c[i]) == pytest.approx(float((t.max() + t.min()) / 2))
        assert float(r[i]) == pytest.approx(max(float((t.max() - t.min()) / 2), 1e-3))
    assert layout.fingerprint == flat.layout_of(models.build_model("cnn", 1, 10)).fingerprint
    assert layout.fingerprint != flat.layout_of(models.build_model("cnn", 1, 7)).fingerprint


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flat_view_on_cuda() -> None:
    cpu = models.build_model("cnn", 1, 10, seed=8)
    gpu = models.build_model("cnn", 1, 10, seed=8, device="cuda")
    vec = flat.flatten(gpu)
    assert vec.device.type == "cuda"
    assert torch.equal(vec.cpu(), flat.flatten(cpu))
    layout = flat.layout_of(gpu)
    c, r = flat.layer_center_radius(vec, layout, margin=0.1)
    c_cpu, r_cpu = flat.layer_center_radius(vec.cpu(), layout, margin=0.1)
    assert (
        c.device.type == "cuda"
        and torch.allclose(c.cpu(), c_cpu)
        and torch.allclose(r.cpu(), r_cpu)
    )
    assert flat.expand_per_element(c, layout).device.type == "cuda"
    assert flat.layer_ids(layout, device="cuda").device.type == "cuda"
    flat.load_flat(cpu, vec * 0.5)  # a CUDA vector into a CPU model
    assert torch.equal(flat.flatten(cpu), (vec * 0.5).cpu())


@pytest.mark.parametrize("name", ["cnn", "resnet18"])
def test_empty_model_has_the_built_models_layout_and_loads_it_exactly(name: str) -> None:
    """The client's uninitialised skeleton takes a strict load of the global model bit for bit."""
    channels = 1 if name == "cnn" else 3
    built = models.build_model(name, channels, 10, seed=3)
    empty = models.empty_model(name, channels, 10)
    assert flat.layout_of(empty) == flat.layout_of(built)
    empty.load_state_dict(built.state_dict(), strict=True)
    for (k, a), (k2, b) in zip(built.state_dict().items(), empty.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b)
    with pytest.raises(ValueError, match="unknown model"):
        models.empty_model("vgg", 3, 10)
