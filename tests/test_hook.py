"""Code outside ``numbagrad/kernels/`` reaches a device only through the
entry points of ``numbagrad.kernels`` (``call``, ``empty``, ``from_host``,
``to_host``, ``host_copy``) and ``buffers.take``, which is what lets
``ng.compile``'s recorder subscribe instead of patching modules."""
from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import codes as S

PACKAGE = pathlib.Path(ng.__file__).parent
# what only numbagrad.kernels' entry points may touch on a device module
GUARDED = set(kernels.get("cpu").KERNELS) | {"empty", "from_host", "to_host", "KERNELS"}
# compile replays what it recorded (kernels/ and compile/ are not checked);
# buffers is the pool's own allocator
EXEMPT = {("buffers.py", "empty")}


def _device_attribute(node: ast.Attribute) -> bool:
    """``<...>.kern.<name>`` or ``<...>._kern.<name>``, or a name ending in _mt."""
    base = node.value
    name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
    return name in ("kern", "_kern") and (node.attr in GUARDED or node.attr.endswith("_mt"))


def test_no_direct_kernel_access_outside_kernels():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("kernels", "compile"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and _device_attribute(node) \
                    and (str(rel), node.attr) not in EXEMPT:
                bad.append(f"{rel}:{node.lineno}: .{node.attr}")
    assert not bad, "reach kernels through numbagrad.kernels.call/empty/...:\n" + "\n".join(bad)


def test_the_static_check_can_fail():
    tree = ast.parse("kern.unary(0, x, y)\ngroup.kern.fill(a, 0.0)\nt._kern.empty((2,), f)\n"
                     "kern.binary_mt(1)\nkernels.call(kern, 'unary', 3)\nkern.name\n")
    hits = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and _device_attribute(n)]
    assert sorted(hits) == ["binary_mt", "empty", "fill", "unary"]


def _workload(device: str) -> None:
    """Every op family forward and backward, reads and writes of ``.grad``,
    and an optimizer window with clipping, on ``device``."""
    rng = np.random.default_rng(0)
    w = ng.param(rng.normal(size=(4, 3)), device=device)
    b = ng.param(rng.normal(size=(4,)), device=device)
    x = ng.tensor(rng.normal(size=(5, 3)), device=device)
    labels = np.array([0, 1, 2, 3, 1])
    opt = ng.optim.Adam([w, b], lr=0.01, accumulate_steps=2, max_grad_norm=1.0)
    for _ in range(2):
        with ng.grad_tape():
            h = ng.linear(x, w, b, activation="relu")
            y = ng.softmax(h * 2.0 - ng.exp(-h), axis=1) + ng.log_softmax(h, axis=0)
            loss = ng.reshape(y, (4, 5)).sum(axis=1).mean() + ng.mse_loss(h, h * 0.5) \
                + ng.cross_entropy(x @ ng.transpose(w), labels) \
                + ng.binary_cross_entropy_with_logits(h, h * 0.0)
            loss.backward()
        opt.step()
    w.grad = np.ones((4, 3)) if device == "cpu" else w.grad
    w.grad = None
    assert np.isfinite(w.numpy()).all() and np.isfinite(loss.item())


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_workload_reaches_kernels_only_through_the_hook(monkeypatch, device):
    if device == "cuda" and not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    kern = kernels.get(device)
    seen: list[str] = []

    class Spy:
        def kernel(self, fn, name, args):
            seen.append(name)

        def allocated(self, array):
            seen.append("empty")

        def temp(self, kern, shape, dtype):
            return None

        def host_read(self):
            seen.append("to_host")

        def host_copy(self, copy, source):
            seen.append("copy")

    direct: list[str] = []
    for name in [n for n in kern.KERNELS] + [n for n in vars(kern) if n.endswith("_mt")]:
        real = getattr(kern, name)

        def wire(*args, _name=name, _real=real, **kwargs):
            direct.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(kern, name, wire)
    with kernels.observe(Spy()):
        _workload(device)
    assert not direct, f"kernels reached without kernels.call: {sorted(set(direct))}"
    # (on the CPU a small window closes through the boundary kernel, which
    # compile's FusedUpdate calls itself: not a device kernel)
    for name in ("linear", "softmax", "cross_entropy", "fill", "copy", "to_host") \
            + (("sumsq", "adam_update") if device == "cuda" else ()):
        assert name in seen, (name, sorted(set(seen)))


def test_call_picks_the_threaded_twin_and_names_unknown_kernels():
    cpu = kernels.get("cpu")
    seen = []

    class Spy:
        def kernel(self, fn, name, args):
            seen.append((fn, name))

        def allocated(self, array): ...
        def temp(self, kern, shape, dtype): return None
        def host_read(self): ...
        def host_copy(self, copy, source): ...

    x = np.ones((1, 4))
    with kernels.observe(Spy()):
        kernels.call(cpu, "axpby", 4, 1.0, x, 0.0, x.copy())
        kernels.call(cpu, "axpby", cpu.MT_MIN, 1.0, x, 0.0, x.copy())   # memory-bound
        kernels.call(cpu, "axpby", cpu.MT_MIN_MEMORY, 1.0, x, 0.0, x.copy())
        kernels.call(cpu, "unary", cpu.MT_MIN, S.TANH, x, x.copy(), 0.0, 1.0, 0.0)
    assert seen == [(cpu.axpby, "axpby"), (cpu.axpby, "axpby"), (cpu.axpby_mt, "axpby_mt"),
                    (cpu.unary_mt, "unary_mt")]
    with pytest.raises(LookupError, match="no kernel 'nope'"):
        kernels.call(cpu, "nope", 0)
    with kernels.observe(Spy()), pytest.raises(RuntimeError, match="another observer"):
        with kernels.observe(Spy()):
            pass
    assert kernels._observer is None


def test_both_devices_list_the_same_kernels():
    if not ng.cuda_available():
        pytest.skip(ng.cuda_unavailable_reason())
    assert set(kernels.get("cuda").KERNELS) == set(kernels.get("cpu").KERNELS)
