"""Dispatch over op codes, generated from the records rather than written out.

A kernel takes its op's code at run time, yet each of its loops must see
the code as a constant, so that the compiler folds the per-element choice
away and vectorises (a run-time code inside the loop costs ~5x). The
bridge is a ladder, ``if code == 0: loop(0, ...) elif code == 1: ...``,
ending in a raise: a code without a branch is an error, never another op's
formula. ``ladder`` writes one from a list of codes, so adding a record
adds its branch everywhere and no ladder is kept by hand. Its source is
registered with ``linecache``, so tracebacks and ``inspect`` show it.
"""
from __future__ import annotations

import itertools
import linecache
from collections.abc import Callable, Iterable, Mapping
from typing import Any

_serial = itertools.count()


def ladder(name: str, params: str, codes: Iterable[int], body: str,
           namespace: Mapping[str, Any], error: str, otherwise: str | None = None) -> Callable:
    """A plain Python function ``name(code, <params>)``: for each of ``codes``,
    a branch that runs ``body`` (one statement, ``{code}`` standing for the
    constant), and a last one that raises ``ValueError(error)`` (or, given
    ``otherwise``, runs that statement: a ladder over some codes that hands
    the rest on). The names the statements use come from ``namespace``; the
    caller compiles the function (``njit``, ``cuda.jit(device=True)``) or
    runs it as it is."""
    lines = [f"def {name}(code{', ' if params else ''}{params}):"]
    for i, code in enumerate(codes):
        lines += [f"    {'if' if i == 0 else 'elif'} code == {int(code)}:",
                  f"        {body.format(code=int(code))}"]
    lines += ["    else:" if len(lines) > 1 else "    if True:",
              f"        {otherwise}" if otherwise else f"        raise ValueError({error!r})"]
    source = "\n".join(lines) + "\n"
    filename = f"<numbagrad dispatch {name} {next(_serial)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = dict(namespace)
    exec(compile(source, filename, "exec"), scope)   # noqa: S102 (our own generated source)
    fn = scope[name]
    fn.__source__ = source
    return fn
