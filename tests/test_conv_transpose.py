"""conv_transpose1d / conv_transpose2d / conv3d and their layers against
PyTorch: values and the input, weight and bias gradients over stride,
padding, output_padding, dilation and groups, on both devices; an empty
batch; a finite-difference check; torch state dicts; ng.compile; bad input."""

import numpy as np
import pytest

import numbagrad as ng
from conftest import compiled_matches_eager, inputs, matches_torch
from numbagrad.ops._common import ArgumentLengthError

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")

# (op, x shape, weight shape, keyword arguments), each with and without a bias
CASES = [
    ("conv_transpose2d", (2, 3, 3, 4), (3, 2, 3, 3), {}),
    ("conv_transpose2d", (2, 4, 3, 3), (4, 3, 3, 2),
     dict(stride=2, padding=1, output_padding=1, groups=2)),
    ("conv_transpose2d", (1, 2, 4, 3), (2, 2, 2, 3),
     dict(stride=(2, 1), padding=(0, 2), output_padding=(1, 0), dilation=(1, 2))),
    ("conv_transpose2d", (2, 3, 4), (2, 3, 2, 2), dict(stride=3, output_padding=(2, 0))),
    # (above: unbatched; below: output_padding past the stride but under the dilation)
    ("conv_transpose2d", (1, 2, 3, 3), (2, 1, 2, 2), dict(stride=1, dilation=3,
                                                          output_padding=2)),
    ("conv_transpose1d", (2, 4, 5), (4, 1, 3), dict(stride=2, padding=1, output_padding=1,
                                                    groups=2)),
    ("conv_transpose1d", (3, 6), (3, 2, 2), dict(dilation=2)),                     # unbatched
    ("conv3d", (2, 4, 4, 3, 5), (4, 2, 2, 3, 2), dict(stride=(2, 1, 2), padding=(1, 0, 1),
                                                      dilation=(2, 1, 1), groups=2)),
    ("conv3d", (3, 4, 3, 4), (2, 3, 2, 2, 3), dict(padding="same")),               # unbatched
    ("conv3d", (1, 2, 3, 3, 3), (2, 2, 3, 1, 2), dict(padding="valid")),
]


def _bias_size(name, ws, kw):
    return ws[1] * kw.get("groups", 1) if "transpose" in name else ws[0]


@pytest.mark.parametrize("name, xs, ws, kw", CASES, ids=[f"{c[0]}-{i}"
                                                         for i, c in enumerate(CASES)])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_torch(name, xs, ws, kw, bias):
    shapes = [xs, ws] + ([(_bias_size(name, ws, kw),)] if bias else [])
    fn, tfn = getattr(ng, name), getattr(F, name)
    matches_torch(lambda x, w, b=None: fn(x, w, b, **kw),
                  lambda x, w, b=None: tfn(x, w, b, **kw), inputs(shapes, seed=2),
                  name=f"{name}{xs}{ws}{kw}")


@pytest.mark.parametrize("name, ws, kw", [
    ("conv_transpose2d", (2, 3, 3, 3), dict(stride=2, padding=1)),
    ("conv_transpose1d", (2, 2, 3), dict(stride=2, output_padding=1)),
    ("conv3d", (3, 2, 2, 2, 2), dict(padding=1)),
])
def test_an_empty_batch_gives_zero_gradients_as_torch(name, ws, kw):
    cin = ws[0] if "transpose" in name else ws[1]
    xs = (0, cin) + (4,) * (len(ws) - 2)
    matches_torch(lambda x, w, b: getattr(ng, name)(x, w, b, **kw),
                  lambda x, w, b: getattr(F, name)(x, w, b, **kw),
                  inputs([xs, ws, (_bias_size(name, ws, kw),)]), name=name)


# tiny shapes for the CUDA simulator
DEVICE_CASES = [("conv_transpose2d", (1, 2, 2, 3), (2, 1, 2, 2),
                 dict(stride=2, padding=1, output_padding=1, groups=2)),
                ("conv_transpose1d", (2, 2, 3), (2, 2, 2), dict(stride=2, output_padding=1)),
                ("conv3d", (1, 2, 2, 3, 2), (2, 2, 2, 2, 1), dict(padding=(1, 0, 0)))]


@pytest.mark.parametrize("case", range(len(DEVICE_CASES)))
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_on_both_devices(dev, case, dtype):
    name, xs, ws, kw = DEVICE_CASES[case]

    def f(x, w, b):
        out = getattr(ng, name)(x, w, b, **kw)
        assert out.dtype == dtype
        return out
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    matches_torch(f, lambda x, w, b: getattr(F, name)(x, w, b, **kw),
                  [a.astype(dtype) for a in inputs([xs, ws, (_bias_size(name, ws, kw),)], seed=7)],
                  dev=dev, name=name, **tol)


def test_gradcheck():
    x, w, b = (ng.param(a) for a in inputs([(1, 2, 2, 3), (2, 2, 2, 2), (4,)], seed=3))
    weights = ng.tensor(np.random.default_rng(4).normal(size=(1, 4, 3, 5)))

    def loss():
        return (ng.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1,
                                    groups=2) * weights).sum()
    ng.gradcheck(loss, [x, w, b])


def test_conv_transpose_is_the_input_gradient_of_conv():
    """The defining identity: <conv_transpose(y, W), x> == <y, conv(x, W)>."""
    x, y, w = inputs([(2, 4, 7, 6), (2, 6, 4, 3), (6, 2, 3, 2)], seed=11)
    kw = dict(stride=2, padding=1, dilation=(1, 2), groups=2)
    conv = ng.conv2d(ng.tensor(x), ng.tensor(w), **kw).numpy()
    back = ng.conv_transpose2d(ng.tensor(y), ng.tensor(w), output_padding=(0, 1), **kw).numpy()
    assert back.shape == x.shape
    np.testing.assert_allclose((back * x).sum(), (y * conv).sum(), rtol=1e-10)


# ------------------------------------------------------------ layers
@pytest.mark.parametrize("kind, args, kw, xs", [
    ("ConvTranspose2d", (4, 6, 3), dict(stride=2, padding=1, output_padding=1, groups=2),
     (2, 4, 3, 3)),
    ("ConvTranspose2d", (2, 3, (2, 3)), dict(dilation=(2, 1), bias=False), (2, 3, 4)),
    ("ConvTranspose1d", (3, 2, 3), dict(stride=2), (2, 3, 5)),
    ("Conv3d", (2, 4, (2, 3, 2)), dict(stride=(1, 2, 1), padding=1, groups=2), (1, 2, 3, 4, 3)),
])
def test_layers_load_torch_state_dicts(kind, args, kw, xs):
    torch.manual_seed(0)
    ref = getattr(torch.nn, kind)(*args, **kw).double()
    mine = getattr(ng.nn, kind)(*args, **kw, rng=np.random.default_rng(0))
    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    assert {k: v.shape for k, v in mine.state_dict().items()} == \
        {k: v.shape for k, v in state.items()}
    mine.load_state_dict(state)
    x = inputs([xs], seed=9)[0]
    np.testing.assert_allclose(mine(ng.tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(),
                               rtol=1e-9, atol=1e-12)


def test_transposed_layer_init_and_output_size_are_torchs():
    layer = ng.nn.ConvTranspose2d(4, 6, (3, 2), groups=2, rng=np.random.default_rng(1))
    ref = torch.nn.ConvTranspose2d(4, 6, (3, 2), groups=2)
    assert layer.weight.shape == tuple(ref.weight.shape) == (4, 3, 3, 2)
    bound = 1 / np.sqrt(3 * 3 * 2)        # PyTorch's fan_in: weight.shape[1] * prod(kernel)
    assert np.abs(layer.weight.numpy()).max() <= bound < 1.25 * np.abs(layer.weight.numpy()).max()
    assert np.abs(layer.bias.numpy()).max() <= bound
    # forward(x, output_size) picks the output_padding, as PyTorch's
    up = ng.nn.ConvTranspose2d(2, 2, 3, stride=2, padding=1, rng=np.random.default_rng(0))
    tup = torch.nn.ConvTranspose2d(2, 2, 3, stride=2, padding=1).double()
    up.load_state_dict({k: v.detach().numpy() for k, v in tup.state_dict().items()})
    x = inputs([(1, 2, 3, 3)])[0]
    got = up(ng.tensor(x), output_size=(6, 5))
    want = tup(torch.tensor(x), output_size=(6, 5))
    assert got.shape == (1, 2, 6, 5)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-9)
    with pytest.raises(ValueError, match="output_size"):
        up(ng.tensor(x), output_size=(7, 5))


# ------------------------------------------------------------ ng.compile
def _model(seed=0):
    rng = np.random.default_rng(seed)
    f32 = dict(dtype=np.float32, rng=rng)
    up = ng.nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1, **f32)
    grouped = ng.nn.ConvTranspose1d(2, 2, 2, groups=2, **f32)
    conv = ng.nn.Conv3d(1, 2, 2, **f32)

    def loss_fn(x, y):
        h = up(x)                                           # (N, 3, 6, 6)
        v = conv(h.reshape((h.shape[0], 1, 3, 6, 6)))       # (N, 2, 2, 5, 5)
        u = conv(x.reshape((x.shape[0], 1, 2, 3, 3)))       # a view of the argument
        z = grouped(x.reshape((x.shape[0], 2, 9)))
        return ng.mse_loss(v.reshape((h.shape[0], -1)).sum(axis=1) + u.sum() + z.sum(), y)
    return up.parameters() + grouped.parameters() + conv.parameters(), loss_fn


def test_compiled_step_is_bit_identical_to_eager(tmp_path):
    def make():
        params, loss_fn = _model()
        return params, loss_fn, ng.optim.SGD(params, lr=0.01)
    rng = np.random.default_rng(2)
    x = ng.tensor(rng.normal(size=(2, 2, 3, 3)).astype(np.float32))
    y = ng.tensor(rng.normal(size=2).astype(np.float32))
    step = compiled_matches_eager(make, [(x, y)] * 3, tmp_path)
    assert step.stats[-1]["mode"] == "njit"


# ------------------------------------------------------------ bad input
BAD = [
    (lambda x, w: ng.conv_transpose2d(x, w, stride=(1, 2, 3)), ArgumentLengthError,
     "stride must be an int or a tuple of 2"),
    (lambda x, w: ng.conv_transpose2d(x, w, stride=2, output_padding=2), ValueError,
     "output_padding .* must be smaller than either stride"),
    (lambda x, w: ng.conv_transpose2d(x, w, output_padding=(1, 0)), ValueError,
     "output_padding"),
    (lambda x, w: ng.conv_transpose2d(x, w, groups=4), ValueError, "groups=4 must divide"),
    (lambda x, w: ng.conv_transpose2d(x[:, :2], w), ValueError, "has 2 channels but weight"),
    (lambda x, w: ng.conv_transpose2d(x, w, ng.param(np.zeros(3))), ValueError, "bias"),
    (lambda x, w: ng.conv_transpose2d(x, w, padding=3), ValueError, "empty output size"),
    (lambda x, w: ng.conv_transpose2d(x, w, padding="same"), TypeError, "padding must be"),
    (lambda x, w: ng.conv_transpose1d(x, w), ValueError, "conv_transpose1d: input must be"),
    (lambda x, w: ng.conv3d(x[0], w), ValueError, "conv3d: input must be 4-D"),
    (lambda x, w: ng.conv3d(x[None, :2], w[:, :2, None], dilation=(1, 1)), ArgumentLengthError,
     "tuple of 3 ints"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_raises_before_anything_changes(case):
    fn, kind, words = BAD[case]
    x = ng.param(np.ones((2, 3, 3, 3)))
    w = ng.param(np.ones((3, 2, 2, 2)))
    with ng.grad_tape():
        with pytest.raises(kind, match=words):
            fn(x, w)
    assert x.grad is None and w.grad is None
    assert np.all(x.numpy() == 1) and np.all(w.numpy() == 1)
