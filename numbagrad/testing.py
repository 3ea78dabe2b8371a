"""A reusable gradient checker: backward against central finite differences."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .tape import backward, grad_tape
from .tensor import Tensor


def numeric_grad(loss_fn: Callable[[], Tensor], p: Tensor, eps: float) -> np.ndarray:
    """d loss / d p by central differences, perturbing ``p`` in place.

    ``p``'s data is restored exactly afterwards.
    """
    kern = p._kern
    original = p.numpy()
    work = original.copy()
    flat = work.reshape(-1)
    grad = np.zeros(original.shape, np.float64)
    gflat = grad.reshape(-1)
    try:
        for i in range(flat.size):
            x = flat[i]
            flat[i] = x + eps
            kern.upload(work, p.data)
            up = loss_fn().item()
            flat[i] = x - eps
            kern.upload(work, p.data)
            down = loss_fn().item()
            flat[i] = x
            gflat[i] = (up - down) / (2 * eps)
    finally:
        kern.upload(original, p.data)
    return grad


def gradcheck(loss_fn: Callable[[], Tensor], params: Sequence[Tensor], *,
              eps: float | None = None, rtol: float | None = None,
              atol: float | None = None) -> None:
    """Assert that ``ng.backward`` matches finite differences for ``params``.

    ``loss_fn`` builds a one-element loss from the params; it is called once
    on a tape for the analytic gradients and twice per element for the
    numeric ones. Defaults suit float64; float32 params get looser ones.
    Raises AssertionError naming the param and the worst element.
    """
    single = all(p.dtype == np.float32 for p in params)
    eps = eps if eps is not None else (1e-2 if single else 1e-6)
    rtol = rtol if rtol is not None else (2e-3 if single else 1e-6)
    atol = atol if atol is not None else (1e-3 if single else 1e-8)
    with grad_tape():
        loss = loss_fn()
    analytic = backward(loss)
    for n, p in enumerate(params):
        if p.id not in analytic:
            raise AssertionError(f"params[{n}] (shape {p.shape}) got no gradient")
        got = np.asarray(p._kern.to_host(analytic[p.id]), np.float64)
        want = numeric_grad(loss_fn, p, eps)
        bad = np.abs(got - want) > atol + rtol * np.abs(want)
        if bad.any():
            i = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
            raise AssertionError(
                f"params[{n}] (shape {p.shape}, {p.dtype}): backward gives {got[i]!r} at "
                f"{i}, finite differences {want[i]!r} ({int(bad.sum())} of {bad.size} "
                f"elements off)")
