"""Whole-or-nothing file writes whose temporaries outlive no writer.

A write goes to ``.<name>.<pid>.<nonce>.tmp`` beside its target, then is
renamed over it; a writer killed in between leaves that temporary, which
names its process, so the next write to the same target removes the
temporaries of writers that no longer run (checkpoints, ``ng.compile``'s
generated modules). The pid is only meaningful on this machine: a folder
shared between hosts needs writes from one host at a time.
"""
from __future__ import annotations

import os
import re
import secrets

O_BINARY = getattr(os, "O_BINARY", 0)   # Windows: no newline translation


def temp_pattern(base: str) -> re.Pattern[str]:
    """The names of the temporaries for target ``base``: the writer's pid, a nonce."""
    return re.compile(re.escape(f".{base}.") + r"(\d+)\.[0-9a-f]{16}\.tmp")


def writer_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs here (signal 0 only checks; POSIX only)."""
    if os.name != "posix" or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):   # PermissionError: alive, another user's
        return False
    return False


def remove_stale_temporaries(folder: str, base: str) -> None:
    """Delete the temporaries of target ``base`` left by writers that were killed."""
    pattern = temp_pattern(base)
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match and writer_gone(int(match.group(1))):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:   # another save removed it first, or it is not ours to remove
                pass


def create_temporary(folder: str, base: str) -> tuple[int, str]:
    """Create and open a new, private temporary named for the target and this process."""
    while True:
        tmp = os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_BINARY, 0o600), tmp
        except FileExistsError:   # pragma: no cover - a 64-bit nonce collided
            continue
