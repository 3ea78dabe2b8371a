"""Every op against PyTorch (value and every input's gradient, float64, 1e-9),
against finite differences on both devices, and CPU/CUDA agreement.

Each op is one line in ``CASES``: a name, the input shapes, and the same
computation written for numbagrad and for torch.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numbagrad as ng
from conftest import assert_grads_like_torch, inputs, matches_torch, weighted_sum

BROADCASTS = [((3, 4), (4,)), ((3, 4), (3, 1)), ((3, 4), (1, 4)), ((4,), (3, 4)),
              ((3, 1), (1, 4)), ((3, 4), (3, 4)), ((), (3, 4)), ((3, 4), ()), ((5,), (5,))]
BINARY = [("add", ng.add, torch.add), ("sub", ng.sub, torch.sub),
          ("mul", ng.mul, torch.mul), ("div", ng.div, torch.div),
          ("+", lambda a, b: a + b, lambda a, b: a + b),
          ("-", lambda a, b: a - b, lambda a, b: a - b),
          ("*", lambda a, b: a * b, lambda a, b: a * b),
          ("/", lambda a, b: a / b, lambda a, b: a / b)]
UNARY = [("relu", ng.relu, torch.relu),
         ("leaky_relu", lambda x: ng.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2)),
         ("leaky_relu_default", ng.leaky_relu, F.leaky_relu),
         ("tanh", ng.tanh, torch.tanh), ("sigmoid", ng.sigmoid, torch.sigmoid),
         ("exp", ng.exp, torch.exp), ("neg", lambda x: -x, lambda x: -x),
         ("log", lambda x: ng.log(x * x + 0.5), lambda x: torch.log(x * x + 0.5)),
         ("sqrt", lambda x: ng.sqrt(x * x + 0.5), lambda x: torch.sqrt(x * x + 0.5)),
         ("pow2", lambda x: x ** 2, lambda x: x ** 2), ("pow3", lambda x: x ** 3, lambda x: x ** 3),
         ("pow-1", lambda x: (x * x + 1.0) ** -1, lambda x: (x * x + 1.0) ** -1),
         ("pow0.5", lambda x: (x * x + 1.0) ** 0.5, lambda x: (x * x + 1.0) ** 0.5),
         ("pow0", lambda x: x ** 0, lambda x: x ** 0),
         ("method_relu", lambda x: x.relu(), lambda x: x.relu()),
         ("method_sigmoid", lambda x: x.sigmoid(), lambda x: x.sigmoid())]
SCALARS = [("x+s", lambda x: x + 1.5, lambda x: x + 1.5),
           ("s+x", lambda x: 1.5 + x, lambda x: 1.5 + x),
           ("x-s", lambda x: x - 1.5, lambda x: x - 1.5),
           ("s-x", lambda x: 1.5 - x, lambda x: 1.5 - x),
           ("x*s", lambda x: x * 2.5, lambda x: x * 2.5),
           ("s*x", lambda x: 2.5 * x, lambda x: 2.5 * x),
           ("x/s", lambda x: x / 3.0, lambda x: x / 3.0),
           ("s/x", lambda x: 3.0 / (x * x + 1.0), lambda x: 3.0 / (x * x + 1.0))]


def _sum_case(axis, keepdims, mean):
    name = f"{'mean' if mean else 'sum'}(axis={axis}, keepdims={keepdims})"
    if mean:
        return name, lambda x: x.mean(axis, keepdims), \
            lambda x: x.mean() if axis is None and not keepdims else \
            x.mean(dim=tuple(range(x.dim())) if axis is None else axis, keepdim=keepdims)
    return name, lambda x: ng.sum(x, axis, keepdims), \
        lambda x: x.sum() if axis is None and not keepdims else \
        x.sum(dim=tuple(range(x.dim())) if axis is None else axis, keepdim=keepdims)


CASES = []   # (id, shapes, ng function, torch function)
for name, f, g in BINARY:
    CASES += [(f"{name}{sa}{sb}", [sa, sb], f, g) for sa, sb in BROADCASTS]
for name, f, g in UNARY + SCALARS:
    CASES += [(f"{name}{s}", [s], f, g) for s in [(3, 4), (5,), ()]]
for axis in (None, 0, 1, -1):
    for keepdims in (False, True):
        for mean in (False, True):
            name, f, g = _sum_case(axis, keepdims, mean)
            CASES.append((f"{name}(3, 4)", [(3, 4)], f, g))
            if axis in (None, 0, -1):
                CASES.append((f"{name}(5,)", [(5,)], f, g))
for axis in (0, 1, -1):
    CASES += [(f"softmax(axis={axis})", [(3, 4)], lambda x, a=axis: ng.softmax(x, a),
               lambda x, a=axis: torch.softmax(x, a)),
              (f"log_softmax(axis={axis})", [(3, 4)], lambda x, a=axis: ng.log_softmax(x, a),
               lambda x, a=axis: torch.log_softmax(x, a))]
CASES += [
    ("softmax(5,)", [(5,)], ng.softmax, lambda x: torch.softmax(x, -1)),
    ("log_softmax(5,)", [(5,)], ng.log_softmax, lambda x: torch.log_softmax(x, -1)),
    ("T", [(3, 4)], lambda x: x.T * 1.0, lambda x: x.T * 1.0),
    ("T@", [(4, 3), (4, 2)], lambda a, b: a.T @ b, lambda a, b: a.T @ b),
    ("@T", [(3, 4), (2, 4)], lambda a, b: a @ b.T, lambda a, b: a @ b.T),
    ("T@T", [(4, 3), (2, 4)], lambda a, b: a.T @ b.T, lambda a, b: a.T @ b.T),
    ("reshape", [(3, 4)], lambda x: x.reshape(2, 6) * 1.0, lambda x: x.reshape(2, 6) * 1.0),
    ("reshape(-1)", [(3, 4)], lambda x: x.reshape(-1), lambda x: x.reshape(-1)),
    ("T.reshape", [(3, 4)], lambda x: x.T.reshape(12), lambda x: x.T.reshape(12)),
    ("matmul", [(3, 4), (4, 2)], ng.matmul, torch.matmul),
    ("matmul_vec", [(3, 4), (4,)], ng.matmul, torch.matmul),
    # A vector against a transposed matrix: the GEMM must read the matrix
    # through its transpose flag (found in review), square and not.
    ("vec@T", [(3,), (4, 3)], lambda a, b: a @ b.T, lambda a, b: a @ b.T),
    ("T@vec", [(3, 4), (3,)], lambda a, b: a.T @ b, lambda a, b: a.T @ b),
    ("vec@T_square", [(3,), (3, 3)], lambda a, b: a @ b.T, lambda a, b: a @ b.T),
    ("T_square@vec", [(3, 3), (3,)], lambda a, b: a.T @ b, lambda a, b: a.T @ b),
    ("linear", [(5, 3), (4, 3), (4,)], ng.linear, F.linear),
    ("linear_nobias", [(5, 3), (4, 3)], ng.linear, F.linear),
    ("linear_vector", [(3,), (4, 3), (4,)], ng.linear, F.linear),
    ("linear_relu", [(5, 3), (4, 3), (4,)], lambda x, w, b: ng.linear(x, w, b, "relu"),
     lambda x, w, b: torch.relu(F.linear(x, w, b))),
    ("linear_tanh_nobias", [(5, 3), (4, 3)], lambda x, w: ng.linear(x, w, activation="tanh"),
     lambda x, w: torch.tanh(F.linear(x, w))),
    ("linear_sigmoid_vector", [(3,), (4, 3), (4,)],
     lambda x, w, b: ng.linear(x, w, b, activation="sigmoid"),
     lambda x, w, b: torch.sigmoid(F.linear(x, w, b))),
    ("linear_leaky_relu_blas", [(20, 30), (16, 30), (16,)],
     lambda x, w, b: ng.linear(x, w, b, activation="leaky_relu", negative_slope=0.2),
     lambda x, w, b: F.leaky_relu(F.linear(x, w, b), 0.2)),
    ("mse_mean", [(3, 4), (3, 4)], lambda a, b: ng.mse_loss(a, b.data),
     lambda a, b: F.mse_loss(a, b.detach())),
    ("mse_sum", [(3, 4), (3, 4)], lambda a, b: ng.mse_loss(a, b.data, reduction="sum"),
     lambda a, b: F.mse_loss(a, b.detach(), reduction="sum")),
    ("bce_mean", [(3, 4)], lambda x: ng.binary_cross_entropy_with_logits(x, like(x, TARGET_P)),
     lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(TARGET_P))),
    ("bce_sum", [(3, 4)],
     lambda x: ng.binary_cross_entropy_with_logits(x * 500.0, like(x, TARGET_P),
                                                   reduction="sum"),
     lambda x: F.binary_cross_entropy_with_logits(x * 500.0, torch.tensor(TARGET_P),
                                                  reduction="sum")),
    ("cross_entropy_mean", [(3, 4)], lambda x: ng.cross_entropy(x, LABELS),
     lambda x: F.cross_entropy(x, torch.tensor(LABELS))),
    ("cross_entropy_sum", [(3, 4)], lambda x: ng.cross_entropy(x * 300.0, LABELS, "sum"),
     lambda x: F.cross_entropy(x * 300.0, torch.tensor(LABELS), reduction="sum")),
    ("loss_plus_regulariser", [(3, 4), (3, 4)],
     lambda a, b: ng.mse_loss(a, b.data) + 0.01 * (a * a).sum(),
     lambda a, b: F.mse_loss(a, b.detach()) + 0.01 * (a * a).sum()),
    ("loss_times_loss", [(3, 4)],
     lambda x: ng.cross_entropy(x, LABELS)
     * ng.binary_cross_entropy_with_logits(x, like(x, TARGET_P)),
     lambda x: F.cross_entropy(x, torch.tensor(LABELS))
     * F.binary_cross_entropy_with_logits(x, torch.tensor(TARGET_P))),
]


def _table_case(op):
    """A case from an op-table row: ``op.fn`` on the row's sample against its
    PyTorch expression (targets passed as data, detached in torch)."""
    n, k = len(op.sample), op.targets

    def prep(xs):   # into the op's domain, with arithmetic both libraries have
        if op.domain == "positive":
            return [x * x + 0.5 for x in xs]
        if op.domain == "unit":        # |x / (x^2 + 1.5)| <= 0.41
            return [x / (x * x + 1.5) for x in xs]
        if op.domain == "above_one":
            return [x * x + 1.5 for x in xs]
        return list(xs)

    def f(*xs):
        xs = prep(xs)
        return op.fn(*xs[:n - k], *[x.data for x in xs[n - k:]], *op.args)

    def g(*xs):
        xs = prep(xs[:n - k]) + [x.detach() for x in xs[n - k:]]
        return eval(op.torch, {"torch": torch, "F": F, **dict(zip("ab", xs))})
    return (f"{op.name}[table]", list(op.sample), f, g)


TABLE_CASES = [_table_case(op) for op in ng.ops.table.OPS if op.torch]
LEARNABLE = {c[0]: len(op.sample) - op.targets for c, op in
             zip(TABLE_CASES, [op for op in ng.ops.table.OPS if op.torch])}
CASES += TABLE_CASES


def like(x, array):
    """``array`` as a tensor on ``x``'s device."""
    return ng.tensor(array, device=x.device)


TARGET_P = np.random.default_rng(7).uniform(size=(3, 4))
LABELS = np.array([3, 0, 2])


@pytest.mark.parametrize("name, shapes, f, g", CASES, ids=[c[0] for c in CASES])
def test_op_matches_torch(name, shapes, f, g):
    matches_torch(f, g, inputs(shapes), name=name)


GRADCHECK = [c for c in CASES if not c[0].startswith(("bce_sum", "cross_entropy_sum"))
             and "pow0(" not in c[0]]
# rows sized for the CPU's BLAS path: minutes under the CUDA simulator, whose
# GEMM epilogue the smaller rows already check
CPU_SIZED = {"linear_leaky_relu_blas"}


@pytest.mark.parametrize("name, shapes, f, g", GRADCHECK, ids=[c[0] for c in GRADCHECK])
def test_op_gradcheck(dev, name, shapes, f, g):
    if dev.name == "cuda" and name in CPU_SIZED:
        pytest.skip("sized for the CPU's BLAS path")
    arrays = inputs(shapes, seed=2)
    if name.startswith("relu") or "leaky" in name:   # keep clear of the kink at 0
        arrays = [a + np.sign(a) * 0.1 for a in arrays]
    ps = [dev.param(a) for a in arrays]
    weights = dev.tensor(np.random.default_rng(3).normal(size=f(*ps).shape))

    def loss():
        return weighted_sum(f(*ps), weights)

    learnable = ps[:1] if name.startswith("mse") or name == "loss_plus_regulariser" \
        else ps[:LEARNABLE.get(name, len(ps))]
    # CUDA (the simulator): one random direction a param, which a wrong
    # gradient misses with probability 0; the CPU checks every element, and
    # test_op_agrees_between_devices holds the devices' gradients together
    ng.gradcheck(loss, learnable, directions=None if dev.name == "cpu" else 1)


@pytest.mark.parametrize("name, shapes, f, g", CASES[::3], ids=[c[0] for c in CASES[::3]])
def test_op_agrees_between_devices(name, shapes, f, g):
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    results = []
    for device in ("cpu", "cuda"):
        ps = [ng.param(a, device=device) for a in inputs(shapes, seed=4)]
        with ng.grad_tape():
            out = f(*ps)
            loss = weighted_sum(out, ng.tensor(np.linspace(-1, 1, out.size).reshape(out.shape),
                                               device=device))
        grads = ng.backward(loss)
        host = ng.kernels.get(device).to_host
        results.append([out.numpy()] + [host(grads[p.id]) for p in ps if p.id in grads])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------ +-inf and nan inputs
NONFINITE = np.array([np.inf, -np.inf, np.nan, 1.5, -0.5, 0.0])
NONFINITE_CASES = [(name, ["nonfinite"], f, g) for name, f, g in UNARY + SCALARS]
for name, f, g in BINARY[:4]:
    NONFINITE_CASES += [(f"{name}(nonfinite, x)", ["nonfinite", (6,)], f, g),
                        (f"{name}(x, nonfinite)", [(6,), "nonfinite"], f, g),
                        (f"{name}(nonfinite, scalar)", ["nonfinite", ()], f, g)]
NONFINITE_CASES += [
    ("sum", ["nonfinite"], ng.sum, torch.sum),
    ("mean", ["nonfinite"], ng.mean, torch.mean),
    ("matmul", [(2, 6), "nonfinite"], ng.matmul, torch.matmul),
    ("linear_relu", ["nonfinite", (3, 6), (3,)],
     lambda x, w, b: ng.linear(x.reshape(1, 6), w, b, "relu"),
     lambda x, w, b: torch.relu(F.linear(x.reshape(1, 6), w, b))),
    ("softmax", ["nonfinite"], lambda x: ng.softmax(x.reshape(2, 3)),
     lambda x: torch.softmax(x.reshape(2, 3), -1)),
    ("mse", ["nonfinite", (6,)], lambda a, b: ng.mse_loss(a, b.data),
     lambda a, b: F.mse_loss(a, b.detach())),
    ("bce_sum", ["nonfinite"],
     lambda x: ng.binary_cross_entropy_with_logits(x, like(x, TARGET_P.ravel()[:6]), "sum"),
     lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(TARGET_P.ravel()[:6]),
                                                  reduction="sum")),
    ("cross_entropy", ["nonfinite"], lambda x: ng.cross_entropy(x.reshape(2, 3), LABELS[1:]),
     lambda x: F.cross_entropy(x.reshape(2, 3), torch.tensor(LABELS[1:]))),
]


# (the CUDA simulator's NumPy scalars warn about the nan and inf they compute)
@pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")
@pytest.mark.parametrize("name, shapes, f, g", NONFINITE_CASES,
                         ids=[c[0] for c in NONFINITE_CASES])
def test_op_matches_torch_at_nonfinite_inputs(dev, name, shapes, f, g):
    """Values as PyTorch's (nan where it has nan), and every gradient element
    that PyTorch gives as a finite number (d(x + 1)/dx = 1 at x = inf)."""
    rng = np.random.default_rng(5)
    arrays = [NONFINITE if s == "nonfinite" else rng.normal(size=s) for s in shapes]
    ps = [dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = g(*ts)
    weights = rng.normal(size=tuple(want.shape))
    with ng.grad_tape():
        out = f(*ps)
        loss = weighted_sum(out, dev.tensor(weights))
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-15)
    grads = ng.backward(loss)
    (want * torch.tensor(weights)).sum().backward()
    assert_grads_like_torch(f"{name} at {arrays}", ps, ts, grads, rtol=1e-12, atol=1e-15,
                            finite_only=True)
