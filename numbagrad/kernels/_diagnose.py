"""Whether ``device="cuda"`` can be used here and, when not, why.

Asked without importing the CUDA kernels (``numba.cuda`` is imported only
to ask it), so a CPU-only program can report CUDA missing cheaply.
``_registry.check_device`` calls ``cuda_unavailable_reason`` through this
module, so a test patches it here.
"""
from __future__ import annotations

import importlib.util


def cuda_available() -> bool:
    """True when a CUDA device (or Numba's CUDA simulator) is usable."""
    return cuda_unavailable_reason() is None


def cuda_unavailable_reason() -> str | None:
    """Why device="cuda" cannot be used here, or None when it can.

    The CUDA kernels need numba-cuda (the ``cuda`` extra), on a GPU and on
    the simulator alike: without it ``numba.cuda`` is Numba's own built-in
    target, which imports (and, under NUMBA_ENABLE_CUDASIM=1, reports
    itself available) but cannot run numbagrad's kernels.
    """
    try:
        installed = importlib.util.find_spec("numba_cuda") is not None
    except (ImportError, ValueError):    # a broken or half-removed install
        installed = False
    if not installed:
        return ('numba-cuda is not installed (numba\'s own numba.cuda cannot run the CUDA '
                'kernels, not even on the simulator): pip install "numbagrad[cuda]"')
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda broken
        return f'numba.cuda cannot be imported ({exc}); reinstall "numbagrad[cuda]"'
    if getattr(cuda, "implementation", None) != "NVIDIA":
        return ("numba.cuda is Numba's built-in target, not numba-cuda's (its redirect did not "
                'apply, e.g. under python -S); reinstall "numbagrad[cuda]"')
    try:
        if cuda.is_available():
            return None
        cuda.current_context()
    except Exception as exc:
        return f"no usable CUDA GPU or driver ({str(exc).strip() or type(exc).__name__})"
    return "no usable CUDA GPU or driver"
