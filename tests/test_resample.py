"""interpolate and nn.Upsample against PyTorch: nearest, nearest-exact and
the linear modes over sizes, scale factors and align_corners, values and
gradients, on both devices; an empty batch; a finite-difference check;
ng.compile; bad input."""

import numpy as np
import pytest

import numbagrad as ng
from conftest import inputs, matches_torch
from numbagrad.compile import compile as ng_compile
from numbagrad.ops._common import ArgumentLengthError

torch = pytest.importorskip("torch")
F = torch.nn.functional

# (x shape, keyword arguments)
CASES = [
    ((2, 2, 4, 5), dict(size=(7, 3))),                                   # nearest, up and down
    ((2, 2, 4, 5), dict(scale_factor=(1.7, 0.6))),
    ((1, 2, 3, 4), dict(scale_factor=2)),
    ((2, 2, 4, 5), dict(size=(6, 9), mode="nearest-exact")),
    ((2, 2, 4, 5), dict(size=(7, 3), mode="bilinear")),
    ((2, 2, 4, 5), dict(size=(7, 3), mode="bilinear", align_corners=True)),
    ((2, 2, 4, 5), dict(scale_factor=1.1, mode="bilinear")),             # same size, scale used
    ((1, 2, 4, 5), dict(scale_factor=(2.5, 0.5), mode="bilinear", recompute_scale_factor=True)),
    ((2, 2, 4, 5), dict(size=1, mode="bilinear", align_corners=True)),
    ((2, 3, 5), dict(size=8, mode="linear")),
    ((2, 3, 5), dict(scale_factor=0.5, mode="linear", align_corners=True)),
    ((2, 3, 5), dict(size=7)),
    ((1, 2, 3, 4, 2), dict(size=(4, 3, 5), mode="trilinear")),
    ((1, 2, 3, 4, 2), dict(scale_factor=2)),
    ((0, 2, 3, 3), dict(scale_factor=2, mode="bilinear")),                # empty batch
]


@pytest.mark.parametrize("xs, kw", CASES, ids=[str(i) for i in range(len(CASES))])
def test_interpolate_matches_torch(xs, kw):
    matches_torch(lambda x: ng.interpolate(x, **kw), lambda x: F.interpolate(x, **kw),
                  inputs([xs], seed=4), name=str(kw))


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(3, 5), mode="bilinear")],
                         ids=["nearest", "bilinear"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_on_both_devices(dev, kw, dtype):

    def f(x):
        out = ng.interpolate(x, **kw)
        assert out.dtype == dtype
        return out
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    matches_torch(f, lambda x: F.interpolate(x, **kw),
                  [inputs([(1, 2, 2, 3)], seed=6)[0].astype(dtype)], dev=dev, name=str(kw), **tol)


def test_gradcheck():
    x = ng.param(inputs([(1, 1, 3, 4)], seed=3)[0])
    weights = ng.tensor(np.random.default_rng(4).normal(size=(1, 1, 5, 3)))
    for mode in ("nearest", "bilinear"):
        ng.gradcheck(lambda: (ng.interpolate(x, size=(5, 3), mode=mode) * weights).sum(), [x])


def test_upsample_is_torchs():
    x = inputs([(2, 3, 4, 4)], seed=1)[0]
    for kw in (dict(scale_factor=2), dict(size=(5, 6), mode="bilinear", align_corners=True)):
        np.testing.assert_allclose(ng.nn.Upsample(**kw)(ng.tensor(x)).numpy(),
                                   torch.nn.Upsample(**kw)(torch.tensor(x)).numpy(), rtol=1e-12)
    assert ng.nn.Upsample(scale_factor=2).state_dict() == {}


def test_compiled_step_is_bit_identical_to_eager(tmp_path):
    def make():
        return ng.param(np.random.default_rng(0).normal(size=(1, 2, 3, 4)).astype(np.float32))
    wa, wb = make(), make()

    def loss_fn(w, x):
        return (ng.interpolate(x * w, size=(5, 7), mode="bilinear") ** 2).sum() + \
            ng.interpolate(x * w, scale_factor=2).sum()
    step = ng_compile(lambda x: loss_fn(wb, x), cache_dir=str(tmp_path))
    x = ng.tensor(np.random.default_rng(1).normal(size=(2, 2, 3, 4)).astype(np.float32))
    for i in range(3):
        with ng.grad_tape():
            la = loss_fn(wa, x)
        la.backward()
        lb = step(x)
        assert la.numpy().tobytes() == lb.numpy().tobytes(), i
        assert wa.grad.tobytes() == wb.grad.tobytes(), i
    assert step.stats[-1]["mode"] == "njit"


BAD = [
    (dict(size=(2, 3, 4)), ArgumentLengthError, "size must be an int or a tuple of 2"),
    (dict(scale_factor=(2,)), ArgumentLengthError, "scale_factor must be a number or a tuple"),
    (dict(size=2, mode="bicubic"), ValueError, "mode must be one of"),
    (dict(size=2, mode="linear"), ValueError, "mode 'linear' needs a 3-D input"),
    (dict(size=2, align_corners=True), ValueError, "align_corners can only be set"),
    (dict(size=2, scale_factor=2), ValueError, "exactly one of size and scale_factor"),
    (dict(), ValueError, "exactly one of size and scale_factor"),
    (dict(scale_factor=0.1), ValueError, "empty output size"),
    (dict(scale_factor=-1), ValueError, "positive finite"),
    (dict(size=0), ValueError, "positive ints"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises(case):
    kw, kind, words = BAD[case]
    with pytest.raises(kind, match=words):
        ng.interpolate(ng.param(np.ones((1, 2, 3, 3))), **kw)
    with pytest.raises(ValueError, match="3-D, 4-D or 5-D"):
        ng.interpolate(ng.param(np.ones((3, 3))), size=2)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_nearest_with_a_scale_that_keeps_the_size_picks_pytorchs_rows(rank, mode):
    """scale_factor=1.09 keeps 10 rows at 10, but PyTorch still picks rows by
    1 / 1.09 (0, 0, 1, ..., 8), except 2-D "nearest", its identity; the
    forward skipped every such dim. The gradient adds each output's into the
    row it picked."""
    shape = (1, 2) + (10, 7, 5)[:rank]
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape)
    want = torch.nn.functional.interpolate(torch.tensor(x), scale_factor=1.09, mode=mode)
    g = rng.normal(size=tuple(want.shape))
    p = ng.param(x)
    with ng.grad_tape():
        y = ng.interpolate(p, scale_factor=1.09, mode=mode)
        loss = ng.sum(y * g)
    loss.backward()
    np.testing.assert_array_equal(y.numpy(), want.numpy())
    # the gradient of picking rows: each output's gradient added into its source
    marks = np.arange(x.size, dtype=np.float64).reshape(shape)
    src = torch.nn.functional.interpolate(torch.tensor(marks), scale_factor=1.09,
                                          mode=mode).numpy().astype(np.int64)
    grad = np.zeros(x.size)
    np.add.at(grad, src.ravel(), g.ravel())
    np.testing.assert_allclose(p.grad, grad.reshape(shape), rtol=1e-12, atol=1e-12)
