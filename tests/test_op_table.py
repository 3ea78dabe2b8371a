"""The op table (``numbagrad/ops/table.py``) is the one list of ops: the
namespace, the Tensor methods and operators, NumPy dispatch and linear's
activations follow from it, and a kernel code without a branch is an error.
(Each row's PyTorch comparison runs in tests/test_ops.py, ``<name>[table]``.)"""
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import codes
from numbagrad.ops.table import ACTIVATIONS, OPS, UFUNCS

NAMES = [op.name for op in OPS]


def test_namespace_and_all_come_from_the_table():
    assert len(set(NAMES)) == len(NAMES)
    assert ng.ops.__all__ == NAMES
    for op in OPS:
        assert getattr(ng, op.name) is op.fn and getattr(ng.ops, op.name) is op.fn
        assert op.name in ng.__all__


def test_every_public_op_function_has_a_row():
    rowed = {op.fn for op in OPS}
    modules = [importlib.import_module(f"numbagrad.ops.{m.name}")
               for m in pkgutil.iter_modules(ng.ops.__path__)
               if not m.name.startswith("_") and m.name not in ("table", "numpy_api")]
    assert {"elementwise", "losses", "matmul", "reductions", "shape", "join", "indexing",
            "masks", "dropout", "embedding"} <= {m.__name__.rsplit(".", 1)[1] for m in modules}
    for module in modules:
        for name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ \
                    and not name.startswith("_"):
                assert fn in rowed, f"{module.__name__}.{name} has no row in ops/table.py"


def test_methods_and_operators_run_their_row():
    x = ng.param(np.array([[0.5, -1.0], [2.0, 0.25]]))
    for op in OPS:
        if op.method:
            assert getattr(ng.Tensor, op.name).__doc__ == op.fn.__doc__
        for dunder in op.operators:
            assert getattr(ng.Tensor, dunder).__doc__ == op.fn.__doc__, dunder
    np.testing.assert_array_equal((2.0 - x).numpy(), 2.0 - x.numpy())
    np.testing.assert_array_equal((x / 4.0).numpy(), x.numpy() / 4.0)
    np.testing.assert_array_equal((3.0 / x).numpy(), 3.0 / x.numpy())
    np.testing.assert_array_equal((x @ x).numpy(), x.numpy() @ x.numpy())
    np.testing.assert_array_equal((-x).numpy(), -x.numpy())
    np.testing.assert_array_equal(x.leaky_relu(0.5).numpy(),
                                  np.where(x.numpy() > 0, x.numpy(), 0.5 * x.numpy()))


INTEGER_UFUNCS = {u for op in OPS if op.integer for u in op.numpy}


@pytest.mark.parametrize("ufunc", sorted(UFUNCS))
def test_numpy_ufuncs_run_the_op_on_the_tape(ufunc):
    fn = getattr(np, ufunc)
    if ufunc in INTEGER_UFUNCS:   # the bitwise and logical ops: integers, no gradient
        a = ng.tensor(np.array([[1, 6], [-3, 0]]))
        args = (a,) if fn.nin == 1 else (a, a)
        out = fn(*args)
        np.testing.assert_array_equal(out.numpy(), fn(*[t.numpy() for t in args]))
        assert out._node is None and out.dtype.kind in "bi"
        return
    a = ng.param(np.array([[1.5, 2.0], [0.5, 3.0]]))
    args = (a,) if fn.nin == 1 else (a, a)
    with ng.grad_tape():
        out = fn(*args)
        # recorded, except a comparison's boolean result, which carries no gradient
        assert isinstance(out, ng.Tensor) and (out._node is None) == (out.dtype == np.bool_)
    np.testing.assert_allclose(out.numpy(), fn(*[np.asarray(t.data) for t in args]))


def test_linear_activations_are_the_fused_records():
    assert ACTIVATIONS == {r.name: c for c, r in enumerate(codes.UNARY) if r.fuse}
    by_name = {op.name: op for op in OPS}
    for name, code in ACTIVATIONS.items():   # each names its op's row and code
        assert by_name[name].code == code
    x, w = ng.tensor(np.ones((2, 3))), ng.tensor(np.ones((4, 3)))
    for name in ACTIVATIONS:
        ng.linear(x, w, activation=name)
    with pytest.raises(ValueError, match="activation must be None or one of"):
        ng.linear(x, w, activation="exp")


def test_the_records_name_their_codes_and_derive_the_sets():
    for c, r in enumerate(codes.UNARY):
        assert getattr(codes, r.name.upper()) == c
    assert codes.N_UNARY == len(codes.UNARY)
    assert codes.CHEAP_UNARY == {c for c, r in enumerate(codes.UNARY) if r.cheap}
    assert codes.EPILOGUE | codes.PRE_KEPT == set(ACTIVATIONS.values()) | {codes.IDENT}
    assert not codes.EPILOGUE & codes.PRE_KEPT


def _linear_reference(code, x, w, b, p):
    pre = x @ w.T + b
    return np.array([[codes.unary(code, v, p) for v in row] for row in pre])


@pytest.mark.parametrize("threaded", [False, True])
def test_the_cpu_epilogue_applies_every_epilogue_code(threaded):
    # the ladder in kernels/cpu/matmul.py must have a branch per EPILOGUE code
    from numbagrad.kernels import cpu
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(5, 3)), rng.normal(size=(4, 3)), rng.normal(size=4)
    fn = cpu.linear_mt if threaded else cpu.linear
    for code in sorted(codes.EPILOGUE):
        out = np.empty((5, 4))
        fn(x, w, b, out, True, code, 0.25)
        np.testing.assert_allclose(out, _linear_reference(code, x, w, b, 0.25), rtol=1e-12,
                                   err_msg=codes.UNARY[code].name)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_linear_refuses_a_code_outside_its_epilogue(device):
    # (a code without a branch once computed sigmoid on the CPU)
    if device == "cuda" and not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    kern = kernels.get(device)
    x = kern.from_host(np.ones((2, 3)))
    w = kern.from_host(np.ones((4, 3)))
    b = kern.from_host(np.ones(4))
    for code in sorted(set(range(codes.N_UNARY + 1)) - codes.EPILOGUE):
        out = kern.from_host(np.zeros((2, 4)))
        with pytest.raises(ValueError, match="unknown epilogue code"):
            kernels.call(kern, "linear", 0, x, w, b, out, True, code, 0.0)
        assert not kernels.to_host(kern, out).any(), code    # nothing written
    if device == "cpu":   # the threaded twin checks before its blocks run too
        out = np.zeros((64, 64))
        with pytest.raises(ValueError, match="unknown epilogue code"):
            kern.linear_mt(np.ones((64, 1100)), np.ones((64, 1100)), np.ones(64), out, True,
                           codes.GELU, 0.0)
        assert not out.any()


def test_sequential_fuses_exactly_the_epilogue_layers():
    from numbagrad.nn.fusion import _epilogue
    for cls in (ng.nn.ReLU, ng.nn.Tanh, ng.nn.Sigmoid):
        assert _epilogue(cls()) == (cls._linear_activation, 0.0)
    assert _epilogue(ng.nn.LeakyReLU(0.2)) == ("leaky_relu", 0.2)
    assert _epilogue(ng.nn.LeakyReLU(-0.2)) is None    # its gradient is not read from y
    assert _epilogue(ng.nn.SiLU()) is None             # keeps its pre-activation
    assert _epilogue(ng.nn.GELU()) is None

    class Shifted(ng.nn.ReLU):                          # a subclass may compute otherwise
        def forward(self, x):
            return ng.relu(x) + 1.0
    assert _epilogue(Shifted()) is None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_unknown_code_is_an_error_not_another_op(device):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    kern = kernels.get(device)
    x = kern.from_host(np.ones((2, 3)))
    out = kern.from_host(np.zeros((2, 3)))
    calls = [("unary", (codes.N_UNARY, x, out, 0.0, 1.0, 0.0)),
             ("unary_backward", (codes.N_UNARY, x, x, x, out, 0.0, 0.0)),
             ("binary", (codes.N_BINARY, x, x, out)),
             ("binary_backward", (codes.N_BINARY, x, x, x, out, 0.0, True, out, 0.0, True))]
    for name, args in calls:
        with pytest.raises(ValueError, match="unknown op code"):
            kernels.call(kern, name, 0, *args)
        assert not kernels.to_host(kern, out).any(), name    # nothing written


def test_scalar_chains_end_in_an_error():
    with pytest.raises(ValueError, match="unknown op code"):
        codes.unary(codes.N_UNARY, 1.0, 0.0)
    with pytest.raises(ValueError, match="unknown op code"):
        codes.binary_grad_b(codes.N_BINARY, 1.0, 2.0)
    with pytest.raises(ValueError, match="unknown loss code"):
        codes.pointwise_loss(codes.N_POINTWISE, 1.0, 0.0)
