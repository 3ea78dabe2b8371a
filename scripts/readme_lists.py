"""Write README.md's lists of ops, layers and Tensor methods from the code.

The lists sit between marker comments (``<!-- ops:begin -->`` ...
``<!-- ops:end -->``, likewise ``layers`` and ``tensor``) and are rendered
from the op table (``numbagrad/ops/table.py``), ``numbagrad.nn.__all__``
(with the ``__all__`` of each submodule it names) and the public attributes
of ``Tensor``, so a new op, layer or method shows up when this is re-run
and the README cannot drift: ``tests/test_readme_lists.py`` runs the check.

    python scripts/readme_lists.py           # rewrite the lists in README.md
    python scripts/readme_lists.py --check   # exit 1 with a diff if stale
"""
from __future__ import annotations

import argparse
import difflib
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numbagrad as ng                 # noqa: E402  (this checkout's, not an install's)
from numbagrad.ops import table        # noqa: E402

# The op table's families, by the module an op's function lives in. Rows
# that ``table.unary_op`` makes from an elementwise code's record live in
# ``table`` itself. A module not named here gets a heading of its own name.
OP_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Creation", ("creation",)),
    ("Elementwise", ("elementwise", "activations", "table", "arith")),
    ("Matrix products", ("matmul",)),
    ("Reductions", ("reductions", "extrema", "statistics", "sorting")),
    ("Shapes, joins and indexing", ("shape", "join", "indexing", "layout")),
    ("Comparisons, selection and casts", ("masks",)),
    ("Losses", ("losses",)),
    ("Network ops", ("conv", "pool", "norm", "attention", "dropout", "embedding")),
)
# ``ng.nn``'s modules, in the order the README lists them; others follow.
LAYER_FAMILIES: tuple[tuple[str, str], ...] = (
    ("module", "Base"),
    ("layers", "Layers"),
    ("activation", "Activations"),
    ("containers", "Containers"),
    ("conv", "Convolution and pooling"),
    ("norm", "Normalisation"),
    ("attention", "Attention"),
    ("rnn", "Recurrent"),
    ("loss", "Losses"),
)
OPERATORS = {
    "__add__": "+", "__sub__": "-", "__mul__": "*", "__truediv__": "/", "__pow__": "**",
    "__matmul__": "@", "__neg__": "unary -", "__getitem__": "x[key]", "__lt__": "<",
    "__mod__": "%", "__floordiv__": "//",
    "__le__": "<=", "__gt__": ">", "__ge__": ">=", "__eq__": "==", "__ne__": "!=",
}
MARKERS = ("ops", "layers", "tensor")


def _short(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def _file(module: str) -> str:
    """``numbagrad.ops.losses`` -> ``ops/losses.py``."""
    return module.removeprefix("numbagrad.").replace(".", "/") + ".py"


def _bullet(text: str, width: int = 78) -> str:
    """``text`` wrapped as a Markdown bullet, no line break inside a code span."""
    kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
    lines = textwrap.wrap(kept, width, subsequent_indent="  ", break_long_words=False,
                          break_on_hyphens=False)
    return "\n".join(lines).replace("\0", " ")


def _join(names: Iterable[str]) -> str:
    names = list(names)
    return ", ".join(names) if names else "(none yet)"


def _op_entry(op: table.Op) -> str:
    """``add`` (``+``, ``np.add``): the op's name, then the operators,
    Tensor method and NumPy functions that run it."""
    extras = [OPERATORS.get(d, d) for d in op.operators if not d.startswith("__r")]
    extras += [f"x.{op.name}()"] if op.method else []
    extras += [f"np.{name}" for name in op.numpy]
    return f"`{op.name}`" + (" (" + ", ".join(f"`{e}`" for e in extras) + ")" if extras else "")


def op_families() -> list[tuple[str, list[str], list[table.Op]]]:
    """The op table's rows by family: (heading, modules, rows in table order)."""
    known = {m: heading for heading, modules in OP_FAMILIES for m in modules}   # short names
    order = [heading for heading, _ in OP_FAMILIES]
    rows: dict[str, list[table.Op]] = {}
    modules: dict[str, list[str]] = {}
    for op in table.OPS:
        module = op.fn.__module__
        short = _short(module)
        heading = known.get(short) if module.rpartition(".")[0] == "numbagrad.ops" else None
        heading = heading or short.strip("_").replace("_", " ").capitalize()
        if heading not in order:
            order.append(heading)
        rows.setdefault(heading, []).append(op)
        if module not in modules.setdefault(heading, []):
            modules[heading].append(module)
    return [(h, modules[h], rows[h]) for h in order if h in rows]


def render_ops() -> str:
    """The op list, one bullet per family."""
    lines = []
    for heading, modules, rows in op_families():
        where = ", ".join(f"`{_file(m)}`" for m in modules if m != table.__name__)
        lines.append(_bullet(f"- **{heading}** ({where}): " + _join(map(_op_entry, rows))))
    return "\n".join(lines)


def render_layers() -> str:
    """``ng.nn``'s names by module, then each submodule ``__all__`` names."""
    import numbagrad.nn as nn
    classes: dict[str, list[str]] = {}
    submodules = []
    for name in nn.__all__:
        obj = getattr(nn, name)
        if isinstance(obj, types.ModuleType):
            submodules.append(name)
        else:
            classes.setdefault(obj.__module__, []).append(name)
    labels = {f"numbagrad.nn.{m}": label for m, label in LAYER_FAMILIES}
    order = [m for m in labels if m in classes] + [m for m in classes if m not in labels]
    lines = [_bullet(f"- **{labels.get(m, _short(m).capitalize())}** (`{_file(m)}`): "
                     + _join(f"`{n}`" for n in classes[m])) for m in order]
    for name in submodules:
        module = getattr(nn, name)
        public = getattr(module, "__all__", None)
        if public is None:
            public = [n for n in vars(module) if not n.startswith("_")
                      and callable(getattr(module, n))]
        lines.append(_bullet(f"- **`ng.nn.{name}`** (`{_file(module.__name__)}`): "
                             + _join(f"`{n}`" for n in public)))
    return "\n".join(lines)


def render_tensor() -> str:
    """Tensor's public attributes that are not an op-table method."""
    ops = {op.name for op in table.OPS if op.method}
    props, methods = [], []
    for name in sorted(n for n in dir(ng.Tensor) if not n.startswith("_") and n not in ops):
        attr = inspect.getattr_static(ng.Tensor, name)
        if isinstance(attr, property) or not callable(getattr(ng.Tensor, name)):
            props.append(f"`.{name}`")
        else:
            methods.append(f"`.{name}()`")
    in_place = [m for m in methods if m.endswith("_()`")]
    others = [m for m in methods if m not in in_place]
    return "\n".join(_bullet(line) for line in (
        f"- **Attributes**: {_join(props)}",
        f"- **Methods** (besides the ops' `x.NAME()` above): {_join(others)}",
        f"- **In place**: {_join(in_place)}"))


RENDERERS = {"ops": render_ops, "layers": render_layers, "tensor": render_tensor}


def updated(text: str) -> str:
    """``text`` (README.md's) with each marked list re-rendered."""
    for marker in MARKERS:
        begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start or text.count(begin) != 1 or text.count(end) != 1:
            raise ValueError(f"README.md needs exactly one {begin} followed by one {end}")
        body = RENDERERS[marker]()
        text = text[:start + len(begin)] + "\n" + body + "\n" + text[stop:]
    return text


def stale_diff(path: Path | None = None) -> str:
    """The diff from ``path`` (README.md) to its re-rendered lists ("" when
    up to date)."""
    path = README if path is None else path
    text = path.read_text()
    return "".join(difflib.unified_diff(text.splitlines(True), updated(text).splitlines(True),
                                        f"{path.name} (now)", f"{path.name} (generated)"))


def main(argv: list[str] | None = None) -> int:
    """Rewrite README.md's lists, or with ``--check`` report a stale one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 with a diff when README.md is stale")
    args = parser.parse_args(argv)
    diff = stale_diff()
    if args.check:
        if diff:
            sys.stdout.write(diff)
            print("README.md's lists are stale: run python scripts/readme_lists.py",
                  file=sys.stderr)
            return 1
        return 0
    if diff:
        README.write_text(updated(README.read_text()))
        print("README.md: lists rewritten")
    else:
        print("README.md: lists already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
