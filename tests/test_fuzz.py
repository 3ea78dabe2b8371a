"""Differential fuzzing: random small graphs of ng ops (random broadcastable
shapes, intermediates and params reused at random) give PyTorch's values and
gradients on the CPU, and the CPU's on CUDA (the simulator in CI).

CI runs a fixed seed (the "ci" Hypothesis profile); run locally with
NUMBAGRAD_FUZZ_SCALE=20 for a longer hunt. Every failure found becomes a
named regression test at the bottom of this file.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import numbagrad as ng

SHAPES = [(), (3,), (2, 3), (2, 1), (1, 3), (3, 2),
          (2, 2, 3), (2, 1, 3), (1, 2, 1), (2, 2, 1, 3), (0, 3), (2, 0, 1)]
UNARY = {
    "relu": (ng.relu, torch.relu), "tanh": (ng.tanh, torch.tanh),
    "sigmoid": (ng.sigmoid, torch.sigmoid), "neg": (lambda x: -x, lambda x: -x),
    "leaky": (lambda x: ng.leaky_relu(x, 0.3), lambda x: F.leaky_relu(x, 0.3)),
    "exp_tanh": (lambda x: ng.exp(ng.tanh(x)), lambda x: torch.exp(torch.tanh(x))),
    "log1p_sq": (lambda x: ng.log(x * x + 1.0), lambda x: torch.log(x * x + 1.0)),
    "sqrt1p_sq": (lambda x: ng.sqrt(x * x + 1.0), lambda x: torch.sqrt(x * x + 1.0)),
    "square": (lambda x: x ** 2, lambda x: x ** 2),
    "scale": (lambda x: 0.5 * x - 1.0, lambda x: 0.5 * x - 1.0),
    "rdiv": (lambda x: 2.0 / (x * x + 1.0), lambda x: 2.0 / (x * x + 1.0)),
}
BINARY = {"add": (ng.add, torch.add), "sub": (ng.sub, torch.sub), "mul": (ng.mul, torch.mul),
          "div": (lambda a, b: a / (b * b + 1.0), lambda a, b: a / (b * b + 1.0))}


def broadcastable(sa, sb):
    n = max(len(sa), len(sb))
    pa, pb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    return all(x == y or x == 1 or y == 1 for x, y in zip(pa, pb))


@st.composite
def programs(draw):
    """(input shapes, instructions); instruction i makes value len(inputs) + i."""
    n_in = draw(st.integers(1, 3))
    shapes = [draw(st.sampled_from(SHAPES)) for _ in range(n_in)]
    live = list(shapes)
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "softmax", "shape",
                                     "matmul"]))
        i = draw(st.integers(0, len(live) - 1))
        s = live[i]
        if kind == "binary":
            j = draw(st.integers(0, len(live) - 1))
            if not broadcastable(s, live[j]):
                continue
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))), i, j))
            n = max(len(s), len(live[j]))
            pa = (1,) * (n - len(s)) + s
            pb = (1,) * (n - len(live[j])) + live[j]
            live.append(tuple(max(x, y) for x, y in zip(pa, pb)))
        elif kind == "reduce" and s:
            axes = list(range(-len(s), len(s)))
            pairs = [(a, b) for a in range(len(s)) for b in range(a + 1, len(s))]
            axis = draw(st.sampled_from([None] + axes + pairs))
            keep = draw(st.booleans())
            steps.append(("reduce", draw(st.sampled_from(["sum", "mean"])), i, axis, keep))
            live.append(tuple(np.empty(s).sum(axis=axis, keepdims=keep).shape))
        elif kind == "softmax" and s and 0 not in s:
            axis = draw(st.integers(-len(s), len(s) - 1))
            steps.append(("softmax", draw(st.sampled_from(["softmax", "log_softmax"])), i, axis))
            live.append(s)
        elif kind == "shape" and len(s) == 2:
            what = draw(st.sampled_from(["T", "flat"]))
            steps.append(("shape", what, i))
            live.append(s[::-1] if what == "T" else (s[0] * s[1],))
        elif kind == "matmul" and len(s) == 2:
            cands = [j for j, t in enumerate(live) if len(t) in (1, 2) and t[0] == s[1]]
            if not cands:
                continue
            j = draw(st.sampled_from(cands))
            steps.append(("matmul", "matmul", i, j))
            live.append((s[0],) + live[j][1:])
        else:
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY))), i))
            live.append(s)
    return shapes, steps, live


def run(program, values, lib):
    """Evaluate ``program`` over ``values`` with lib "ng" or "torch"."""
    shapes, steps, _ = program
    vals = list(values)
    side = 0 if lib == "ng" else 1
    for step in steps:
        kind, name, i = step[:3]
        x = vals[i]
        if kind == "unary":
            out = UNARY[name][side](x)
        elif kind == "binary":
            out = BINARY[name][side](x, vals[step[3]])
        elif kind == "reduce":
            axis, keep = step[3], step[4]
            if lib == "ng":
                out = getattr(ng, name)(x, axis, keep)
            else:
                dims = tuple(range(x.dim())) if axis is None else axis
                out = getattr(torch, name)(x, dim=dims, keepdim=keep)
        elif kind == "softmax":
            out = getattr(ng if lib == "ng" else torch, name)(x, step[3])
        elif kind == "shape":
            out = x.T if name == "T" else x.reshape(-1)
        else:
            out = x @ vals[step[3]]
        vals.append(out)
    return vals


def weights_for(shape, seed):
    return np.random.default_rng(seed).normal(size=shape)


def ng_loss(program, device, arrays):
    params = [ng.param(a, device=device) for a in arrays]
    _, _, live = program
    with ng.grad_tape():
        vals = run(program, params, "ng")
        # Every value feeds the loss, each with its own upstream weights.
        loss = None
        for k, (v, shape) in enumerate(zip(vals, live)):
            term = (v * ng.tensor(weights_for(shape, k), device=device)).sum()
            loss = term if loss is None else loss + term
    grads = ng.backward(loss)
    host = ng.kernels.get(device).to_host
    return ([v.numpy() for v in vals], loss.item(),
            [host(grads[p.id]) if p.id in grads else None for p in params])


def torch_loss(program, arrays):
    params = [torch.tensor(a, requires_grad=True) for a in arrays]
    _, _, live = program
    vals = run(program, params, "torch")
    loss = sum((v * torch.tensor(weights_for(shape, k))).sum()
               for k, (v, shape) in enumerate(zip(vals, live)))
    loss.backward()
    return [v.detach().numpy() for v in vals], loss.item(), [p.grad.numpy() for p in params]


def arrays_for(program, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s) for s in program[0]]


def check_against_torch(program, seed=0):
    arrays = arrays_for(program, seed)
    got_vals, got_loss, got_grads = ng_loss(program, "cpu", arrays)
    want_vals, want_loss, want_grads = torch_loss(program, arrays)
    for k, (g, w) in enumerate(zip(got_vals, want_vals)):
        assert g.shape == w.shape, (k, program[1])
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=f"value {k}")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-9, atol=1e-12)
    for k, (g, w) in enumerate(zip(got_grads, want_grads)):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10, err_msg=f"grad of input {k}")


@settings(max_examples=examples(150))
@given(program=programs())
def test_random_graphs_match_torch(program):
    check_against_torch(program)


@settings(max_examples=examples(6))
@given(program=programs())
def test_random_graphs_agree_between_cpu_and_cuda(program):
    if not ng.cuda_available():
        pytest.skip("CUDA unusable here")
    arrays = arrays_for(program, 1)
    cpu, cuda = ng_loss(program, "cpu", arrays), ng_loss(program, "cuda", arrays)
    for g, w in zip(cpu[0] + [cpu[1]] + cpu[2], cuda[0] + [cuda[1]] + cuda[2]):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12)


# --------------------------------------------------------------- regressions
# Failures the fuzzer found, kept as named cases (none of these may regress).
def test_regression_a_node_read_by_two_paths_runs_after_both():
    # Found by the fuzzer: v = exp(tanh(x)); v / (v * v + 1). The reverse
    # order ran v's backward before the v * v branch had sent its gradient.
    check_against_torch(([()], [("unary", "exp_tanh", 0), ("unary", "exp_tanh", 0),
                                ("binary", "div", 1, 1)], [(), (), (), ()]))


def test_regression_same_tensor_on_both_sides_of_a_binary_op():
    # x * x: both gradients land in one destination; they must add, not race.
    check_against_torch(([(2, 3)], [("binary", "mul", 0, 0), ("binary", "div", 1, 1)],
                         [(2, 3), (2, 3), (2, 3)]))


def test_regression_transpose_of_a_transpose_feeding_matmul():
    check_against_torch(([(2, 3), (3,)], [("shape", "T", 0), ("shape", "T", 2),
                                          ("matmul", "matmul", 3, 1)],
                         [(2, 3), (3,), (3, 2), (2, 3), (2,)]))
