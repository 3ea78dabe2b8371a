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
_stable: set[str] = set()    # the source names of the ladders made with an origin


def ladder(name: str, params: str, codes: Iterable[int], body: str,
           namespace: Mapping[str, Any], error: str, otherwise: str | None = None,
           origin: str | None = None) -> Callable:
    """A plain Python function ``name(code, <params>)``: for each of ``codes``,
    a branch that runs ``body`` (one statement, ``{code}`` standing for the
    constant), and a last one that raises ``ValueError(error)`` (or, given
    ``otherwise``, runs that statement: a ladder over some codes that hands
    the rest on). The names the statements use come from ``namespace``; the
    caller compiles the function (``njit``, ``cuda.jit(device=True)``) or
    runs it as it is. Given ``origin`` (the name of the module that makes
    it, once), the function belongs to that module, its source's name is
    stable across processes, and Numba may cache it beside that module's
    file (``numbagrad._cache``)."""
    lines = [f"def {name}(code{', ' if params else ''}{params}):"]
    for i, code in enumerate(codes):
        lines += [f"    {'if' if i == 0 else 'elif'} code == {int(code)}:",
                  f"        {body.format(code=int(code))}"]
    lines += ["    else:" if len(lines) > 1 else "    if True:",
              f"        {otherwise}" if otherwise else f"        raise ValueError({error!r})"]
    source = "\n".join(lines) + "\n"
    if origin is None:
        filename = f"<numbagrad dispatch {name} {next(_serial)}>"
    else:
        # (Numba names the cache files after the last part: "elementwise-_unary_block")
        filename = f"<numbagrad dispatch {origin.replace('.', '/')}-{name}>"
        if filename in _stable:
            raise ValueError(f"dispatch.ladder: {origin} makes a ladder {name!r} twice")
        _stable.add(filename)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = dict(namespace)
    if origin is not None:
        scope["__name__"] = origin
    exec(compile(source, filename, "exec"), scope)   # noqa: S102 (our own generated source)
    fn = scope[name]
    fn.__source__ = source
    return fn
