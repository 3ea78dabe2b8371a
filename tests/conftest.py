"""Shared fixtures: every device-aware test runs once per device.

The CUDA half runs under Numba's CUDA simulator unless NUMBA_ENABLE_CUDASIM
is set to 0 beforehand (scripts/gpu_check.py does that on a real GPU). The
simulator is switched on here, before anything imports numba, with small
launch shapes so that several blocks, the grid-stride loops and the bounds
guards all run.
"""
import inspect
import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# every kernels.call_typed checks its arguments against its key's types
# (tests/test_typed_calls.py also runs the unchecked path)
os.environ.setdefault("NUMBAGRAD_CHECK_TYPED", "1")
if os.environ["NUMBA_ENABLE_CUDASIM"] == "1":
    # The simulator runs each CUDA thread as a Python thread: few per block
    # keeps it quick while 4x4 GEMM tiles and 2 blocks of 8 threads still
    # leave every bounds guard and grid-stride loop something to do.
    for key, value in {"NUMBAGRAD_CUDA_TILE": "2", "NUMBAGRAD_CUDA_WPT": "2",
                       "NUMBAGRAD_CUDA_THREADS": "8", "NUMBAGRAD_CUDA_BLOCKS": "2"}.items():
        os.environ.setdefault(key, value)
    if "numba" in sys.modules and not sys.modules["numba"].config.ENABLE_CUDASIM:
        raise RuntimeError("numba was imported before tests/conftest.py could enable "
                           "the CUDA simulator; set NUMBA_ENABLE_CUDASIM=1 yourself")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import numbagrad as ng  # noqa: E402

SIMULATED = os.environ["NUMBA_ENABLE_CUDASIM"] == "1"


def _quicken_the_simulator() -> None:
    """Run the simulator's blocks several times sooner, and its shared arrays
    race-free.

    Its block manager polls its threads in a loop that holds the GIL until
    the interpreter makes it switch (every 5 ms): the simulated threads wait
    that long for each turn. Here the same loop gives the GIL up after each
    poll. With turns that short a race in ``cuda.shared.array`` can show
    (two threads of a block each find no array and make their own), so
    allocation takes a lock. Where the simulator's internals differ, it is
    left as it is (slower; tests/test_simulator.py then fails)."""
    import threading
    import time

    from numba.core import types
    from numba.np import numpy_support
    try:
        from numba.cuda.simulator import kernel, kernelapi
        manager, shared, thread = kernel.BlockManager, kernelapi.FakeCUDAShared, \
            kernel.BlockThread
        if list(inspect.signature(shared.array).parameters) != \
                ["self", "shape", "dtype", "alignment"] or \
                list(inspect.signature(thread).parameters) != \
                ["f", "manager", "blockIdx", "threadIdx", "debug"] or \
                not {"syncthreads_blocked", "syncthreads_event", "exception", "abort"} <= \
                set(vars(thread(None, manager(None, (1, 1, 1), (1, 1, 1), False), (0, 0, 0),
                                (0, 0, 0), False))):
            return
    except (ImportError, AttributeError, TypeError, ValueError):
        return
    array, lock = shared.array, threading.Lock()

    def run(self, grid_point, *args):
        # the simulator's loop, the same steps, plus a sleep(0) per poll
        def target():
            self._f(*args)

        threads = [thread(target, self, grid_point, point, self._debug)
                   for point in np.ndindex(*self._block_dim)]
        for t in threads:
            t.start()
        live, blocked = set(threads), set()
        while live:
            for t in live:
                if t.syncthreads_blocked:
                    blocked.add(t)
                elif t.exception:
                    for other in threads:   # abort the others, as the simulator does
                        other.abort = True
                        other.syncthreads_blocked = False
                        other.syncthreads_event.set()
                    raise t.exception[0].with_traceback(t.exception[1])
            if live == blocked:
                for t in blocked:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
                blocked = set()
            else:
                time.sleep(0)
            live = {t for t in live if t.is_alive()}
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    def shared_array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:   # dynamic shared memory, or the refusal
            return array(self, shape, dtype, alignment)
        caller = sys._getframe(1)   # one array per line of source, as the simulator has it
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                res = self._allocations[key] = np.empty(shape, dtype)
        return res

    manager.run = run
    shared.array = shared_array


if SIMULATED:
    _quicken_the_simulator()

# Hypothesis: a fixed seed in CI (CI=true), fresh examples locally; scale the
# example counts with NUMBAGRAD_FUZZ_SCALE (say 10) for a longer local hunt.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
FUZZ_SCALE = float(os.environ.get("NUMBAGRAD_FUZZ_SCALE", "1"))


def examples(n: int) -> int:
    """``n`` Hypothesis examples, times NUMBAGRAD_FUZZ_SCALE."""
    return max(1, int(n * FUZZ_SCALE))


class Dev:
    """Builds test data on one device and reads results back to the host."""

    def __init__(self, name: str) -> None:
        self.name = name

    def tensor(self, x, dtype=None):
        return ng.tensor(x, dtype=dtype, device=self.name)

    def param(self, x, dtype=None):
        return ng.param(x, dtype=dtype, device=self.name)

    @staticmethod
    def host(x) -> np.ndarray:
        """Any array, tensor or device array as a host ndarray."""
        if isinstance(x, ng.Tensor):
            return x.numpy()
        if hasattr(x, "copy_to_host"):
            return x.copy_to_host()
        return np.asarray(x)

    @staticmethod
    def address(array) -> int:
        """The device address of an array's first element."""
        iface = getattr(array, "__cuda_array_interface__", None)
        if iface is None:
            array = getattr(array, "_ary", array)   # the simulator's fake device array
            iface = array.__array_interface__
        return iface["data"][0]

    def __repr__(self) -> str:
        return self.name


def cuda_dev() -> Dev:
    """The "cuda" Dev, for tests of CUDA-only behaviour (launch counts, device
    index arrays); skips where CUDA is unusable."""
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here: " + str(ng.kernels.cuda_unavailable_reason()))
    return Dev("cuda")


@pytest.fixture
def typed_unchecked(monkeypatch):
    """``kernels.call_typed`` as outside the suite: no CHECK_TYPED, found
    specialisations forgotten, and the hot tables that fill then (which the
    checked suite never fills) emptied before and after."""
    monkeypatch.setattr(ng.kernels._typed_calls, "CHECK_TYPED", False)
    monkeypatch.setattr(ng.kernels._typed_calls, "_typed", {})
    monkeypatch.setattr(ng.kernels._typed_calls, "_typed_signature", {})
    ng.kernels.clear_hot_tables()
    yield
    ng.kernels.clear_hot_tables()


@pytest.fixture(params=["cpu", "cuda"])
def dev(request) -> Dev:
    if request.param == "cuda" and not ng.cuda_available():
        pytest.skip("CUDA unusable here: " + str(ng.kernels.cuda_unavailable_reason()))
    return Dev(request.param)


def mse_loss_of(dev: Dev, W, x, y, reduction="mean"):
    """Record mse_loss(W @ x, y) on a tape and return the loss."""
    with ng.grad_tape():
        return ng.mse_loss(ng.matmul(W, dev.tensor(x)), dev.tensor(y), reduction=reduction)


def inputs(shapes, seed: int = 0) -> list:
    """Random normal float64 arrays of ``shapes`` (the op tables' inputs)."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s) for s in shapes]


def weighted_sum(out, weights):
    """A loss that gives every output element its own upstream gradient."""
    return (out * weights).sum() if out.ndim else out * weights.reshape(())


def assert_grads_like_torch(name: str, params: list, torch_inputs: list, grads, *,
                            rtol: float, atol: float, finite_only: bool = False) -> None:
    """Each param's gradient in ``grads`` (what ``ng.backward`` returned) equals
    the matching torch input's ``.grad``; an input torch gives no gradient
    must get none. ``finite_only``: compare only where torch's is finite."""
    for i, (p, t) in enumerate(zip(params, torch_inputs)):
        if t.grad is None:
            assert p.id not in grads, f"{name}: input {i} should get no gradient"
            continue
        want = t.grad.numpy()
        got = Dev.host(grads[p.id]).reshape(want.shape)
        where = np.isfinite(want) if finite_only else np.ones(want.shape, bool)
        np.testing.assert_allclose(got[where], want[where], rtol=rtol, atol=atol,
                                   err_msg=f"{name}: gradient of input {i}")


def matches_torch(f, g, arrays, dev: Dev | None = None, name: str = "", rtol: float = 1e-9,
                  atol: float = 1e-12) -> None:
    """``f`` on numbagrad params holding ``arrays`` (on ``dev``, default the
    CPU) against ``g`` on torch tensors: the values, and every input's
    gradient of a loss that weighs each output element on its own."""
    import torch   # here, not at the top: most test files never need it
    ps = [ng.param(a) if dev is None else dev.param(a) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = g(*ts)
    weights = np.random.default_rng(1).normal(size=tuple(want.shape))
    with ng.grad_tape():
        out = f(*ps)
        loss = weighted_sum(out, ng.tensor(weights) if dev is None else dev.tensor(weights))
    assert out.shape == tuple(want.shape), name
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=rtol, atol=atol,
                               err_msg=name)
    grads = ng.backward(loss)
    (want * torch.tensor(weights)).sum().backward()
    assert_grads_like_torch(name, ps, ts, grads, rtol=rtol, atol=atol)


def compiled_matches_eager(make, batches, cache_dir, same_random=False):
    """``make()`` -> (params, loss_fn, optimizer), called twice: one copy
    trained eagerly, the other through ``ng.compile``, on the same
    ``batches`` (tuples of loss_fn's arguments); the losses and the params
    agree bit for bit after every step (``same_random``: the compiled step
    draws the eager one's random numbers, its dropout masks). Returns the
    compiled step."""
    (pa, fa, oa), (pb, fb, ob) = make(), make()
    step = ng.compile(fb, optimizer=ob, cache_dir=str(cache_dir))
    for i, args in enumerate(batches):
        state = ng.random.get_state()
        with ng.grad_tape():
            la = fa(*args)
        la.backward()
        oa.step()
        if same_random:
            ng.random.set_state(state)
        lb = step(*args)
        assert la.numpy().tobytes() == lb.numpy().tobytes(), i
        for a, b in zip(pa, pb, strict=True):
            assert a.numpy().tobytes() == b.numpy().tobytes(), i
    return step


class KernelNames:
    """A ``kernels.observe`` observer that keeps the names of the kernels that
    run (``names``) and leaves allocations and copies alone."""

    def __init__(self):
        self.names = []

    def kernel(self, fn, name, args):
        self.names.append(name)

    def allocated(self, array):
        pass

    def temp(self, kern, shape, dtype):
        return None

    def host_read(self):
        pass

    def host_copy(self, copy, source):
        pass


def small_cnn(nn, channels: int = 1, **kw):
    """A small CNN in ``nn`` (``ng.nn`` or ``torch.nn``; ``kw`` to the layers
    with weights): Conv2d(channels, 4), ReLU, MaxPool2d(2), Conv2d(4, 6),
    ReLU, MaxPool2d(2), Flatten, Linear(6, 3), for 4x4 images."""
    return nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1, **kw), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 6, 3, padding=1, **kw), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(6, 3, **kw))


def sequential_like_torch(layers, x, labels) -> list:
    """``layers(nn, **kw)`` built in ng (float64) and in torch with the same
    weights: one cross-entropy step on ``x``, ``labels`` gives the same loss
    and parameter gradients (to rounding). Returns the kernels ng ran."""
    import torch   # here, not at the top: most test files never need it
    model = layers(ng.nn, dtype=np.float64, rng=np.random.default_rng(0))
    tmodel = layers(torch.nn).double()
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    seen = KernelNames()
    with ng.kernels.observe(seen):
        with ng.grad_tape():
            loss = ng.cross_entropy(model(ng.tensor(x)), labels)
        ng.backward(loss)   # (into the params' .grad)
    tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(labels))
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-12)
    tparams = dict(tmodel.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, tparams[name].grad.numpy(), rtol=1e-9, atol=1e-12)
    return seen.names


def cuda_launches(f, x) -> tuple[int, int]:
    """CUDA launches of ``out = f(x)`` recorded on a tape, and of its node's
    backward given a gradient of ones (the op alone, no seed)."""
    before = ng.cuda.launch_count()
    with ng.grad_tape():
        out = f(x)
    forward = ng.cuda.launch_count() - before
    ctx = ng.tape._Backward.make(collect=True)
    before = ng.cuda.launch_count()
    out._node.backward(ctx, out._node, ng.kernels.get("cuda").from_host(np.ones(out.shape)))
    return forward, ng.cuda.launch_count() - before


def run_threads(work, n: int) -> list:
    """``work(i)`` in n threads ("trainer-0", ...) switching as often as the
    interpreter allows; the (i, exception) pairs they raised."""
    import threading
    errors = []

    def run(i):
        try:
            work(i)
        except BaseException as exc:   # reported by the test
            errors.append((i, exc))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)        # interleave the threads as often as possible
    try:
        threads = [threading.Thread(target=run, args=(i,), name=f"trainer-{i}")
                   for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors
