"""CUDA device helpers: availability and the counters tests assert on.

Importing this module does not import ``numba.cuda``; the counters load the
CUDA kernels on first use and raise a clear error where CUDA is unusable.
"""
from __future__ import annotations

from . import kernels


def is_available() -> bool:
    """True when device="cuda" can be used (a GPU, or Numba's simulator)."""
    return kernels.cuda_available()


def launch_count() -> int:
    """Kernel launches numbagrad has issued on the CUDA device so far."""
    return kernels.get("cuda").launch_count()


def transfer_count() -> int:
    """Host<->device copies numbagrad has made so far."""
    return kernels.get("cuda").transfer_count()


def synchronize() -> None:
    """Wait for every queued kernel (for timing)."""
    kernels.get("cuda").synchronize()
