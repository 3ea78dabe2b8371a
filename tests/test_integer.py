"""Integer and bool tensors (issue 30): PyTorch's type promotion, integer
arithmetic, the bitwise and logical ops (the table's ``integer`` rows),
comparisons, ``where``, reductions, indexing and joins on both devices,
each value and dtype against PyTorch; they never get a gradient, and a
gradient through a promotion lands in the float operand's dtype."""
import itertools

import numpy as np
import pytest

import numbagrad as ng
from numbagrad.ops.table import OPS

torch = pytest.importorskip("torch")

DEVICES = ["cpu", "cuda"]
DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float32, np.float64]
TORCH = {np.dtype(d): getattr(torch, np.dtype(d).name if d is not np.bool_ else "bool")
         for d in DTYPES}


@pytest.fixture(autouse=True)
def _torch_float64():
    """numbagrad's default float is float64 until set: compare with torch's
    at the same default."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def same(ours, theirs):
    """Equal values and equal dtypes."""
    got = ours.numpy() if isinstance(ours, ng.Tensor) else np.asarray(ours)
    want = theirs.numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def pair_of(dtype, device, shape=(2, 3), seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        a = rng.random(shape) > 0.5
    elif dtype.kind == "u":
        a = rng.integers(0, 9, shape).astype(dtype)
    else:
        a = rng.integers(-9, 9, shape).astype(dtype)
    return ng.tensor(a, device=device), torch.tensor(a)


# ------------------------------------------------------------ promotion
def _operands(dtype):
    """The operand forms of one dtype: a dimensioned tensor, a 0-d tensor,
    and (for the Python kinds) a Python number."""
    d = np.dtype(dtype)
    out = [("tensor", np.zeros(2, d)), ("0-d", np.zeros((), d))]
    if d == np.bool_:
        out.append(("number", True))
    elif d == np.int64:
        out.append(("number", 3))
    elif d == np.float64:
        out.append(("number", 2.5))
    return out


def test_result_type_is_torchs():
    forms = [f for d in DTYPES for f in _operands(d)]
    for (ka, a), (kb, b) in itertools.product(forms, forms):
        if ka == kb == "number":
            continue
        ta = torch.tensor(a) if ka != "number" else a
        tb = torch.tensor(b) if kb != "number" else b
        want = torch.result_type(ta, tb)
        assert TORCH[ng.result_type(a, b)] == want, (ka, getattr(a, "dtype", a),
                                                      kb, getattr(b, "dtype", b))


@pytest.mark.parametrize("device", DEVICES)
def test_a_python_number_never_changes_a_tensors_dtype(device):
    """The issue's example: ng.maximum(x32, 0) stays float32 (and so do the
    other binary ops, comparisons and where), on both devices."""
    x = ng.tensor(np.array([-1.5, 0.5, 2.0], np.float32), device=device)
    for value in (0, 2, 2.5, True, np.float64(0.5)):
        for out in (ng.maximum(x, value), ng.minimum(value, x), x + value, value * x,
                    ng.where(x > value, x, value), ng.fmod(x, 3), x ** 2):
            assert out.dtype == np.float32 and out.device == device
    i = ng.tensor(np.array([1, -2], np.int32), device=device)
    assert (i + 3).dtype == np.int32 and (i * True).dtype == np.int32
    assert (i + 2.5).dtype == ng.get_default_dtype()
    assert ((i > 0) + 1).dtype == np.int64                 # bool beside an int: int64


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_promote_as_torch(device):
    shape = (2, 3) if device == "cpu" else (2, 2)
    pairs = [(np.int32, np.int64), (np.uint8, np.int8), (np.bool_, np.int16),
             (np.int64, np.float32), (np.float32, np.float64), (np.bool_, np.float32)]
    for da, db in pairs:
        (a, ta), (b, tb) = pair_of(da, device, shape, 1), pair_of(db, device, shape, 2)
        for fn, tfn in ((ng.add, torch.add), (ng.mul, torch.mul), (ng.maximum, torch.maximum),
                        (ng.eq, torch.eq), (ng.gt, torch.gt)):
            same(fn(a, b), tfn(ta, tb))
        same(ng.where(a > 0, a, b), torch.where(ta > 0, ta, tb))
        same(ng.cat([a.reshape(1, -1), b.reshape(1, -1)]),
             torch.cat([ta.reshape(1, -1), tb.reshape(1, -1)]))


# ------------------------------------------------------------ arithmetic
INT_BINARY = [
    ("add", ng.add, torch.add), ("sub", ng.sub, torch.sub), ("mul", ng.mul, torch.mul),
    ("floor_divide", ng.floor_divide, torch.floor_divide),
    ("remainder", ng.remainder, torch.remainder), ("fmod", ng.fmod, torch.fmod),
    ("div", ng.div, torch.div),
    ("div_trunc", lambda a, b: ng.div(a, b, rounding_mode="trunc"),
     lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("div_floor", lambda a, b: ng.div(a, b, rounding_mode="floor"),
     lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("maximum", ng.maximum, torch.maximum), ("minimum", ng.minimum, torch.minimum),
    ("pow", ng.pow, torch.pow),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", [(np.int32, np.int32), (np.int64, np.int32), (np.int8, np.int8)])
def test_integer_arithmetic_matches_torch(device, dtypes):
    a0 = np.array([[7, -7, 5, 0], [-5, 3, -1, 4]])
    b0 = np.array([2, -3, -2, 3])                    # no zero: a divisor
    a, b = a0.astype(dtypes[0]), b0.astype(dtypes[1])
    x, y = ng.tensor(a, device=device), ng.tensor(b, device=device)
    tx, ty = torch.tensor(a), torch.tensor(b)
    for name, fn, tfn in INT_BINARY:
        if name == "pow":                            # (small bases: int8 never overflows)
            same(fn(x % 4, abs(y)), tfn(tx % 4, ty.abs()))
            same(x ** 2, tx ** 2)
            same(2 ** abs(y), 2 ** ty.abs())
            continue
        same(fn(x, y), tfn(tx, ty))
        same(fn(x, 3), tfn(tx, torch.tensor(3)))     # a number keeps the dtype
        same(fn(-4, y), tfn(torch.tensor(-4), ty))      # (a 0-d tensor: a number)
    for op in ("__add__", "__sub__", "__mul__", "__floordiv__", "__mod__", "__truediv__",
               "__radd__", "__rsub__", "__rmul__"):
        same(getattr(x, op)(2), getattr(tx, op)(2))
    same(-x, -tx)
    same(ng.abs(x), torch.abs(tx))
    same(ng.sign(x), torch.sign(tx))
    same(ng.exp(x), torch.exp(tx))                   # float ops compute in the default float
    same(ng.sqrt(ng.abs(x)), torch.sqrt(tx.abs()))


def test_integer_overflow_wraps_as_torch():
    a = np.array([120, -120, 100], np.int8)
    same(ng.tensor(a) + ng.tensor(a), torch.tensor(a) + torch.tensor(a))
    same(ng.tensor(a) * 3, torch.tensor(a) * 3)
    big = np.array([2 ** 62 + 1, -(2 ** 62) - 3, 2 ** 53 + 1], np.int64)
    for fn in (lambda t: t.reshape(3, 1).T, lambda t: t[np.array([2, 0])],
               lambda t: ng.flip(t, 0) if isinstance(t, ng.Tensor) else torch.flip(t, (0,)),
               lambda t: t + 1, lambda t: t.sum(), lambda t: t.max()):
        same(fn(ng.tensor(big)), fn(torch.tensor(big)))   # exact: never through a float


@pytest.mark.parametrize("device", DEVICES)
def test_bool_arithmetic(device):
    (a, ta), (b, tb) = pair_of(np.bool_, device, (2, 3), 3), pair_of(np.bool_, device, (2, 3), 4)
    same(a + b, ta + tb)
    same(a * b, ta * tb)
    same(ng.maximum(a, b), torch.maximum(ta, tb))
    same(a + 1, ta + 1)
    same(a * 2.5, ta * 2.5)
    x = ng.tensor(np.array([[1.5, -2.0, 3.0]] * 2), device=device)
    same(a * x, ta * torch.tensor(x.numpy()))        # a mask times floats
    for fn in (lambda: a - b, lambda: x - a, lambda: 1 - a):
        with pytest.raises(TypeError, match="sub: subtracting a bool tensor"):
            fn()
    with pytest.raises(TypeError, match="floor_divide: not defined for two bool tensors"):
        a // b
    with pytest.raises(TypeError, match="neg: not defined for a bool tensor"):
        -a


# ------------------------------------------------------------ bitwise / logical
INTEGER_ROWS = [op for op in OPS if op.integer]


def test_the_integer_rows_are_the_bitwise_and_logical_ops():
    assert {op.name for op in INTEGER_ROWS} == {
        "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift",
        "bitwise_right_shift", "logical_and", "logical_or", "logical_xor", "logical_not"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", INTEGER_ROWS, ids=[op.name for op in INTEGER_ROWS])
def test_integer_rows_match_torch(op, device):
    tfn = getattr(torch, op.name)
    unary = op.name in ("bitwise_not", "logical_not")
    shift = "shift" in op.name
    kinds = [(np.int64, np.int64), (np.int32, np.int64), (np.uint8, np.uint8)]
    if not shift:
        kinds += [(np.bool_, np.bool_), (np.int16, np.bool_)]
    if op.name.startswith("logical"):
        kinds += [(np.float32, np.int32)]            # the logical ops take any dtype
    for da, db in kinds[: 2 if device == "cuda" else None]:
        (a, ta), (b, tb) = pair_of(da, device, (2, 3), 5), pair_of(db, device, (3,), 6)
        if shift:
            b, tb = ng.abs(b) % 4, tb.abs() % 4
        if unary:
            same(op.fn(a), tfn(ta))
            same(getattr(a, op.name)(), tfn(ta))
        else:
            same(op.fn(a, b), tfn(ta, tb))
            same(getattr(a, op.name)(b), tfn(ta, tb))
            same(op.fn(a, 1), tfn(ta, torch.tensor(1)).to(tfn(ta, torch.tensor(1)).dtype))
        for dunder in op.operators:
            if dunder == "__invert__":
                same(~a, ~ta)
            else:
                same(getattr(a, dunder)(b), getattr(ta, dunder)(tb))
        for ufunc in op.numpy:
            ours, theirs = ((a,), (ta,)) if unary else ((a, b), (ta, tb))
            same(getattr(np, ufunc)(*ours), tfn(*theirs))


def test_bitwise_ops_refuse_floats():
    x = ng.tensor(np.array([1.0, 2.0]))
    for fn in (lambda: x & x, lambda: ~x, lambda: ng.bitwise_or(x, 1),
               lambda: ng.tensor([1, 2]) | 1.5):
        with pytest.raises(TypeError, match="takes integer or bool tensors"):
            fn()
    same(ng.tensor([5, -5]) << ng.tensor([64, -1]), torch.tensor([5, -5]) << torch.tensor([64, -1]))
    same(ng.tensor([5, -5]) >> ng.tensor([70, -2]), torch.tensor([5, -5]) >> torch.tensor([70, -2]))
    with pytest.raises(TypeError, match="cannot shift bool tensors"):
        ng.tensor([True]) << ng.tensor([False])
    same(ng.tensor([True]) << 1, torch.tensor([True]) << 1)      # a bool beside an int: int64


# ------------------------------------------------------------ selection and reductions
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_reductions_and_selection_match_torch(device, dtype):
    a, ta = pair_of(dtype, device, (3, 4), 7)
    same(ng.sum(a), torch.sum(ta))                   # integers and bools sum to int64
    same(ng.prod(a, 1), torch.prod(ta, 1))
    same(ng.prod(a), torch.prod(ta))
    same(ng.sum(a, 1, keepdims=True), torch.sum(ta, 1, keepdim=True))
    same(ng.sum(a, (0, 1)), torch.sum(ta, (0, 1)))
    same(a.sum(0), ta.sum(0))
    same(ng.amax(a, 0), torch.amax(ta, 0))
    same(ng.max(a), torch.max(ta))
    same(ng.min(a, 1).values, torch.min(ta, 1).values)
    same(ng.min(a, 1).indices, torch.min(ta, 1).indices)
    if dtype != np.bool_:                          # (torch's argmax takes no bools)
        same(ng.argmax(a, 1), torch.argmax(ta, 1))
        same(ng.argmin(a), torch.argmin(ta))
    same(ng.where(a > 0 if dtype != np.bool_ else a, a, ng.zeros_like(a).astype(dtype)),
         torch.where(ta > 0 if dtype != np.bool_ else ta, ta, torch.zeros_like(ta)))
    same(a == a, ta == ta)
    same(a[1], ta[1])
    same(a[:, 1:3], ta[:, 1:3])
    same(a[np.array([2, 0])], ta[torch.tensor([2, 0])])
    same(a.T, ta.T)
    same(a.reshape(2, 6), ta.reshape(2, 6))
    same(ng.stack([a, a]), torch.stack([ta, ta]))
    same(ng.cat([a, a], 1), torch.cat([ta, ta], 1))
    same(ng.flip(a, 0), torch.flip(ta, (0,)))
    same(ng.tril(a), torch.tril(ta))
    same(a.astype(np.float32), ta.float())
    same(a.long(), ta.long())
    same(a.bool(), ta.bool())
    same(ng.any(a), torch.any(ta))
    same(ng.all(a, 1), torch.all(ta, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_casts_match_torch(device):
    x = np.array([-2.7, -0.5, 0.0, 0.5, 1.9, 300.0])
    t = ng.tensor(x, device=device)
    for d in (np.int64, np.int32, np.bool_, np.int16):
        same(t.astype(d), torch.tensor(x).to(TORCH[np.dtype(d)]))
    same(ng.tensor(np.array([True, False]), device=device).astype(np.float32),
         torch.tensor([1.0, 0.0], dtype=torch.float32))


def test_integer_reductions_refuse_what_torch_refuses():
    i = ng.tensor(np.arange(6).reshape(2, 3))
    with pytest.raises(TypeError, match="mean: the mean of an integer or bool tensor"):
        ng.mean(i)
    with pytest.raises(ValueError, match="amax: cannot reduce over a size-0 axis"):
        ng.amax(ng.tensor(np.zeros((0, 3), np.int64)), 0)
    same(ng.sum(ng.tensor(np.zeros((0, 3), np.int32)), 0), torch.zeros(3, dtype=torch.int64))


# ------------------------------------------------------------ no gradients, errors
def test_integers_never_get_a_gradient_and_promotion_records_the_cast():
    assert ng.tensor([1, 2]).dtype == np.int64 and ng.tensor([True]).dtype == np.bool_
    assert ng.param([1, 2]).dtype == ng.get_default_dtype()      # a param is a float
    with pytest.raises(TypeError, match="a param holds float32 or float64"):
        ng.param([1, 2], dtype=np.int32)
    w = ng.param(np.array([0.5, -1.0, 2.0], np.float32))
    k = ng.tensor(np.array([3, -2, 5], np.int64))
    tw = torch.tensor(w.numpy(), requires_grad=True)
    tk = torch.tensor(k.numpy())
    with ng.grad_tape():
        mask = k > 0                                  # a bool result: not recorded
        assert mask._node is None and (k * 2)._node is None
        loss = ng.sum(w * k + ng.where(mask, w, 0.0) * w)
    grads = ng.backward(loss)
    (tw * tk + torch.where(tk > 0, tw, 0.0) * tw).sum().backward()
    assert loss.dtype == np.float32 and w.grad.dtype == np.float32
    np.testing.assert_allclose(np.asarray(w.grad), tw.grad.numpy(), rtol=1e-6)
    assert k.id not in grads
    x64 = ng.param(np.array([1.0, 2.0]))
    with ng.grad_tape():                              # float32 with float64: float64
        out = ng.sum(w[:2] * x64)
    ng.backward(out)
    assert out.dtype == np.float64 and x64.grad.dtype == np.float64
    np.testing.assert_allclose(np.asarray(x64.grad), w.numpy()[:2])


def test_integer_errors_name_the_problem():
    a = ng.tensor(np.array([4, 5], np.int32))
    for fn in (lambda: a // ng.tensor(np.array([1, 0], np.int32)), lambda: a % 0,
               lambda: ng.fmod(a, 0), lambda: ng.div(a, 0, rounding_mode="trunc")):
        with pytest.raises(ZeroDivisionError, match="integer division by zero"):
            fn()
    with pytest.raises(ValueError, match="pow: integers to negative integer powers"):
        a ** -1
    assert np.isinf((a / 0).numpy()).all()           # true division is in floats
    with pytest.raises(TypeError, match="astype: tensors hold .* not complex128"):
        a.astype(np.complex128)
    with pytest.raises(TypeError, match="tensor data must be real numbers or bools"):
        ng.tensor(np.array(["a"]))


def test_compiled_step_with_an_integer_mask():
    """A compiled training step that builds a mask from integer labels and
    counts the hits: the same loss, gradients and counts as eager."""
    rng = np.random.default_rng(0)
    x = ng.tensor(rng.standard_normal((6, 3)))
    labels = ng.tensor(np.array([0, 2, 1, 2, 0, 1]))
    classes = labels.numpy()
    w = ng.param(rng.standard_normal((3, 3)))

    def step(x, labels):
        with ng.grad_tape():
            logits = x @ w
            hits = ng.sum(logits > 0)                # an int64 count
            weight = ng.where(labels > 0, 1.0, 0.5)
            loss = ng.sum(ng.cross_entropy(logits, classes, reduction="none") * weight)
        ng.backward(loss)
        return loss, hits

    eager_loss, eager_hits = step(x, labels)
    g = np.array(w.grad)
    w.grad = None
    fast = ng.compile(step)
    for _ in range(2):
        w.grad = None
        loss, hits = fast(x, labels)
        np.testing.assert_allclose(loss.numpy(), eager_loss.numpy(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(w.grad), g, rtol=1e-12)
        same(hits, eager_hits.numpy())
        assert hits.dtype == np.int64


@pytest.mark.parametrize("device", DEVICES)
def test_int_tensors_index_as_index_arrays_do(device):
    """An int64 tensor is an index array wherever one is taken: x[i],
    x[:, i], several in one key, gather, a 0-d one as an int, class targets."""
    x0 = np.arange(12.0).reshape(3, 4)
    x = ng.param(x0, device=device)
    tx = torch.tensor(x0, requires_grad=True)
    i = ng.tensor(np.array([2, 0, 2]), device=device)
    ti = torch.tensor([2, 0, 2])
    labels = ng.tensor(np.array([0, 3, 1]), device=device)
    with ng.grad_tape():
        loss = (ng.sum(x[i]) + ng.sum(x[:, i]) + ng.sum(x[i, i])
                + ng.sum(ng.gather(x, 1, i.reshape(3, 1))) + ng.sum(x[ng.tensor(1)])
                + ng.cross_entropy(x, labels))
    ng.backward(loss)
    want = (tx[ti].sum() + tx[:, ti].sum() + tx[ti, ti].sum()
            + torch.gather(tx, 1, ti.reshape(3, 1)).sum() + tx[1].sum()
            + torch.nn.functional.cross_entropy(tx, torch.tensor([0, 3, 1])))
    want.backward()
    np.testing.assert_allclose(float(loss), want.item(), rtol=1e-12)
    grad = x.grad.copy_to_host() if device == "cuda" else np.asarray(x.grad)
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-12)
    with pytest.raises(IndexError, match="out of range|outside"):
        x[ng.tensor(np.array([3]), device=device)]


def test_a_float_dtype_equal_but_not_identical_stays_a_float():
    """A dtype object equal to float32 but not numpy's own (as a memmap's may
    be) is still float32: ops keep it rather than promoting (CI's sklearn
    readonly-memmap check found this)."""
    dt = np.dtype(np.float32).newbyteorder("=")
    assert dt is not np.dtype(np.float32)
    x = ng.as_tensor(np.ones((2, 3), dt))
    for out in (ng.relu(x), ng.exp(x), x + 1, ng.sum(x), x[0], ng.maximum(x, 0)):
        assert out.dtype == np.float32


INT_DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64]
EDGE_OPS = {"+": lambda p, q: p + q, "-": lambda p, q: p - q, "*": lambda p, q: p * q,
            "//": lambda p, q: p // q, "%": lambda p, q: p % q, "&": lambda p, q: p & q,
            "|": lambda p, q: p | q, "^": lambda p, q: p ^ q}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # the simulator's
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_arithmetic_at_every_dtypes_edges_matches_torch(dtype, device):
    """Every pair of edge values (min, max, -1, 0, 1, ...) under each op, against
    PyTorch. uint8 differences below 0 and powers past 255 gave 0: Numba
    typed the formulas for uint8 in uint64 and then float64, whose wrapped
    values came back as 0 (0 - 1 was 0, not 255). INT64_MIN // -1 gave 0."""
    info = np.iinfo(dtype)
    vals = np.array(sorted({v for v in (info.min, info.min + 1, -3, -1, 0, 1, 2, 3, 100,
                                        info.max - 1, info.max) if info.min <= v <= info.max}),
                    dtype)
    a, b = (v.ravel() for v in np.meshgrid(vals, vals))
    for name, fn in EDGE_OPS.items():
        keep = np.ones(a.size, bool)
        if name in ("//", "%"):
            keep = (b != 0) & ~((a == info.min) & (b == -1) & (info.bits >= 32))  # torch's SIGFPE
        x, y = a[keep], b[keep]
        same(fn(ng.tensor(x, device=device), ng.tensor(y, device=device)),
             fn(torch.tensor(x), torch.tensor(y)))
    base, exp = np.array([3, 2, 100, 7], dtype), np.array([100, 7, 2, 5], dtype)
    same(ng.tensor(base, device=device) ** ng.tensor(exp, device=device),
         torch.tensor(base) ** torch.tensor(exp))
    if dtype == np.int64:
        low = ng.tensor(np.array([info.min, 7]), device=device)
        same(low // -1, np.array([info.min, -7]))     # wrapped, as torch's floor_divide
        same(low % -1, np.array([0, 0]))


@pytest.mark.parametrize("device", DEVICES)
def test_python_ints_beside_narrow_or_wide_integers_are_exact(device):
    """A Python int next to an int64 tensor compared and filled through a
    float (2**53 + 1 == 2**53, 2**63 - 1 overflowed); one outside a narrow
    dtype leaked NumPy's OverflowError. Now: exact in range, wrapped as
    PyTorch's for arithmetic and fills, and NumPy 2's exact answer for a
    comparison with an int outside the dtype (PyTorch wraps it first)."""
    big = np.array([2 ** 53 + 1, 2 ** 62 + 1, -(2 ** 63)])
    X, T = ng.tensor(big, device=device), torch.tensor(big)   # noqa: F841 (read by eval below)
    for b in (2 ** 53 + 1, 2 ** 62 + 1, 2 ** 63 - 1, -(2 ** 63), 2 ** 53):
        for op in ("==", "!=", "<", "<=", ">", ">="):
            same(eval(f"X {op} b"), eval(f"T {op} b"))
            same(eval(f"b {op} X"), eval(f"b {op} T"))
    same(ng.where(ng.tensor([False, True], device=device), ng.tensor([0, 1], device=device),
                  2 ** 53 + 1), np.array([2 ** 53 + 1, 1]))
    same(ng.masked_fill(ng.tensor([0], device=device), ng.tensor([True], device=device),
                        2 ** 53 + 1), np.array([2 ** 53 + 1]))
    u8 = np.array([0, 5, 255], np.uint8)
    U, TU = ng.tensor(u8, device=device), torch.tensor(u8)
    same(U + (-1), TU + (-1))
    same(U * -1, TU * -1)
    same(ng.masked_fill(U, U > 0, -1), TU.masked_fill(TU > 0, -1))
    for b in (-1, 256, -300, 300):
        for op in ("==", "!=", "<", "<=", ">", ">="):
            same(eval(f"U {op} b"), eval(f"u8.astype(np.int64) {op} b"))
    with pytest.raises(OverflowError, match="outside int64 and uint64"):
        U + 2 ** 70


def test_in_place_arithmetic_may_not_widen_an_integer_or_bool_tensor():
    """``x /= 2`` on an int64 tensor truncated silently (and gave floats
    inside a tape); PyTorch refuses it. copy_ and fill_ still cast."""
    for write in (lambda x: x.div_(2), lambda x: x.mul_(2.5), lambda x: x.add_(0.5),
                  lambda x: x.__itruediv__(2)):
        x = ng.tensor([5, -7, 3])
        with pytest.raises(TypeError, match="float64, which the int64 tensor.*cannot hold"):
            write(x)
        same(x, np.array([5, -7, 3]))
    b = ng.tensor([True, False])
    with pytest.raises(TypeError, match="int64, which the bool tensor"):
        b += 1
    x = ng.tensor([5, -7, 3])
    x += 1
    x.fill_(2.7)
    same(x, np.array([2, 2, 2]))
    x.copy_(ng.tensor([1.5, -2.5, 3.5]))
    same(x, np.array([1, -2, 3]))


def test_integer_division_of_an_empty_result_checks_no_divisor():
    """The zero-divisor check ran before broadcasting: an empty result whose
    divisor held 0 raised, where PyTorch returns the empty result."""
    zeros = ng.zeros((1, 3), dtype=np.int64)
    same(ng.zeros((0, 3), dtype=np.int64) // zeros,
         torch.zeros((0, 3), dtype=torch.int64) // torch.zeros((1, 3), dtype=torch.int64))
    with pytest.raises(ZeroDivisionError):
        ng.ones((2, 3), dtype=np.int64) // zeros


def test_integer_exponents_and_fills_are_range_checked_as_torch():
    """A Python int wraps into a narrow tensor's dtype in arithmetic (uint8 +
    300 is 44, as PyTorch's), but not as an exponent or a fill value, which
    PyTorch refuses out of range (-1 fills a uint8 as 255)."""
    u8 = np.array([5, 200, 3], np.uint8)
    U, TU = ng.tensor(u8), torch.tensor(u8)
    same(U + 300, TU + 300)
    same(U ** 2, TU ** 2)
    with pytest.raises(ValueError, match="negative integer powers"):
        U ** -1
    for bad in (lambda: U ** 256, lambda: ng.tensor(np.array([1, -2], np.int8)) ** 200,
                lambda: ng.masked_fill(U, U > 4, 300), lambda: ng.where(U > 4, U, 256),
                lambda: ng.masked_fill(ng.tensor([1, 2]), ng.tensor([True, False]), 2 ** 63)):
        with pytest.raises(OverflowError, match="cannot be converted to .* without overflow"):
            bad()
    same(ng.masked_fill(U, U > 4, -1), TU.masked_fill(TU > 4, -1))


def test_in_place_between_integer_kinds_and_on_empty_tensors():
    """uint8 += an int64 tensor keeps uint8 (integers are one kind, as in
    PyTorch), and an empty tensor, whose NumPy strides are 0, is no
    broadcast view."""
    u = ng.tensor(np.array([1, 250], np.uint8))
    u.add_(ng.tensor([1, 10]))
    same(u, torch.tensor([1, 250], dtype=torch.uint8).add_(torch.tensor([1, 10])))
    for shape in ((3, 0), (0, 10)):
        z = ng.zeros(shape)
        z.fill_(1.0)
        z[...] = 0.0
        z += 1.0
        assert z.shape == shape
