"""The one reader of the kernel packages' integer settings from the environment.

``kernels/cpu/_threads.py`` (the threads thresholds) and ``kernels/cuda/_core.py``
(the launch shapes) read their ``NUMBAGRAD_*`` variables through ``env_int``
once, at import, so every setting is checked and reported the same way.
"""
from __future__ import annotations

import os


def env_int(key: str, default: int, minimum: int = 0) -> int:
    """The integer in environment variable ``key`` (``default`` when unset),
    checked to be at least ``minimum``; the kernel packages' settings read
    through this one function."""
    raw = os.environ.get(key)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value}")
    return value
