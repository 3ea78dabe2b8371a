"""A reusable gradient checker: backward against central finite differences."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from . import kernels
from .tape import backward, grad_tape
from .tensor import Tensor


def _central_difference(loss_fn: Callable[[], Tensor], p: Tensor, base: np.ndarray,
                        step: np.ndarray) -> float:
    """(f(p + step) - f(p - step)) / 2, evaluated with p's data set in place."""
    kern = p._kern
    kernels.call(kern, "upload", 0, base + step, p.data)
    up = loss_fn().item()
    kernels.call(kern, "upload", 0, base - step, p.data)
    down = loss_fn().item()
    return (up - down) / 2


def _derivatives(loss_fn: Callable[[], Tensor], p: Tensor, directions: Iterable[np.ndarray],
                 eps: float) -> list[float]:
    """Central-difference derivatives of the loss along each direction;
    ``p``'s data is restored exactly afterwards."""
    base = p.numpy()
    try:
        return [_central_difference(loss_fn, p, base, eps * d) / eps for d in directions]
    finally:
        kernels.call(p._kern, "upload", 0, base, p.data)


def numeric_grad(loss_fn: Callable[[], Tensor], p: Tensor, eps: float) -> np.ndarray:
    """d loss / d p by central differences, one element at a time."""
    units = np.eye(p.size, dtype=p.dtype).reshape((p.size,) + p.shape)
    return np.array(_derivatives(loss_fn, p, units, eps)).reshape(p.shape)


def gradcheck(loss_fn: Callable[[], Tensor], params: Sequence[Tensor], *,
              eps: float | None = None, rtol: float | None = None,
              atol: float | None = None, directions: int | None = None,
              seed: int = 0) -> None:
    """Assert that ``ng.backward`` matches finite differences for ``params``.

    ``loss_fn`` builds a one-element loss from the params; it is called once
    on a tape for the analytic gradients, then twice per numeric derivative:
    per element by default, or, with ``directions=n``, along n random
    directions per param (HIPS autograd's cheaper check, for slow devices).
    Defaults suit float64; float32 params get looser ones. Raises
    AssertionError naming the param and the worst mismatch.
    """
    single = all(p.dtype == np.float32 for p in params)
    eps = eps if eps is not None else (1e-2 if single else 1e-6)
    rtol = rtol if rtol is not None else (2e-3 if single else 1e-6)
    atol = atol if atol is not None else (1e-3 if single else 1e-8)
    with grad_tape():
        loss = loss_fn()
    analytic = backward(loss)
    rng = np.random.default_rng(seed)
    for n, p in enumerate(params):
        if p.id not in analytic:
            raise AssertionError(f"params[{n}] (shape {p.shape}) got no gradient")
        got = np.asarray(kernels.to_host(p._kern, analytic[p.id]), np.float64)
        if directions is None:
            want = numeric_grad(loss_fn, p, eps)
        else:
            vs = rng.normal(size=(directions,) + p.shape)
            want = np.array(_derivatives(loss_fn, p, vs, eps))
            got = np.array([(got * v).sum() for v in vs])
        bad = np.abs(got - want) > atol + rtol * np.abs(want)
        if bad.any():
            i = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
            what = "direction" if directions else "element"
            raise AssertionError(
                f"params[{n}] (shape {p.shape}, {p.dtype}): backward gives {got[i]!r} at "
                f"{what} {i}, finite differences {want[i]!r} ({int(bad.sum())} of "
                f"{bad.size} off)")
