"""README.md's lists of ops, layers and Tensor methods are the ones
``scripts/readme_lists.py`` renders from the code, so they cannot drift."""
from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import pytest

import numbagrad as ng
import numbagrad.nn as nn
from numbagrad.ops import table

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("readme_lists", ROOT / "scripts" / "readme_lists.py")
readme_lists = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(readme_lists)


def block(marker: str, text: str | None = None) -> str:
    """What README.md holds between ``marker``'s begin and end comments."""
    text = (ROOT / "README.md").read_text() if text is None else text
    found = re.search(f"<!-- {marker}:begin -->(.*?)<!-- {marker}:end -->", text, re.DOTALL)
    assert found, f"README.md has no {marker} markers"
    return found.group(1)


def flat(text: str) -> str:
    """``text`` with its line wrapping undone."""
    return re.sub(r"\s+", " ", text)


def test_the_readme_lists_are_up_to_date():
    diff = readme_lists.stale_diff()
    assert diff == "", ("README.md's generated lists are stale; run "
                        "python scripts/readme_lists.py\n" + diff)


def test_every_public_op_is_listed():
    listed = block("ops")
    missing = [name for name in ng.ops.__all__ if f"`{name}`" not in listed]
    assert missing == [], f"ops missing from README's op list: {missing}"
    assert {op.name for op in table.OPS} == set(ng.ops.__all__)


def test_every_nn_name_is_listed():
    listed = block("layers")
    names = list(nn.__all__)
    for name in nn.__all__:
        module = getattr(nn, name)
        if isinstance(module, types.ModuleType):
            names += getattr(module, "__all__", [])
    missing = [n for n in names if f"`{n}`" not in listed and f"`ng.nn.{n}`" not in listed]
    assert missing == [], f"ng.nn names missing from README's layer list: {missing}"
    for name in ("MultiheadAttention", "GELU", "SiLU", "Softplus"):   # the issue's
        assert f"`{name}`" in listed


def test_every_tensor_method_is_listed():
    listed = block("tensor") + block("ops")
    public = [n for n in dir(ng.Tensor) if not n.startswith("_")]
    missing = [n for n in public if f"`.{n}`" not in listed and f"`.{n}()`" not in listed
               and f"`x.{n}()`" not in listed]
    assert missing == [], f"Tensor attributes missing from README's lists: {missing}"


def test_a_stale_list_fails_the_check_with_a_diff(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    stale = tmp_path / "README.md"
    ops, layers = block("ops", text), block("layers", text)
    dropped = re.sub(r",\s+`scaled_dot_product_attention`", "", ops)
    assert dropped != ops and "`MultiheadAttention`" in layers
    stale.write_text(text.replace(ops, dropped)
                     .replace(layers, layers.replace("`MultiheadAttention`", "")))
    monkeypatch.setattr(readme_lists, "README", stale)
    assert readme_lists.main(["--check"]) == 1
    out = capsys.readouterr().out
    for name in ("scaled_dot_product_attention", "MultiheadAttention"):   # put back
        assert re.search(rf"^\+.*`{name}`", out, re.MULTILINE), out
    assert stale.read_text() != text                     # --check writes nothing
    assert readme_lists.main([]) == 0                    # the rewrite restores it
    assert stale.read_text() == readme_lists.updated(text)
    assert readme_lists.main(["--check"]) == 0


def test_missing_or_doubled_markers_are_an_error():
    with pytest.raises(ValueError, match="<!-- layers:begin -->"):
        readme_lists.updated("<!-- ops:begin -->\n<!-- ops:end -->\n")
    text = "".join(f"<!-- {m}:begin -->\n<!-- {m}:end -->\n" for m in readme_lists.MARKERS)
    with pytest.raises(ValueError, match="exactly one"):
        readme_lists.updated(text + "<!-- ops:begin -->\n")
    assert "`mse_loss`" in block("ops", readme_lists.updated(text))


def test_new_rows_layers_and_methods_are_picked_up(monkeypatch):
    """Nothing is hard-coded: a new op row (from a module not yet known), a
    new layer and a new submodule name show up when the lists are rendered."""
    def twice(x):
        return x

    twice.__module__ = "numbagrad.ops.novel_family"
    monkeypatch.setattr(table, "OPS", (*table.OPS, table.Op("twice", twice, method=True,
                                                                 numpy=("positive",))))
    ops = flat(readme_lists.render_ops())
    assert "- **Novel family** (`ops/novel_family.py`): `twice` (`x.twice()`, `np.positive`)" \
        in ops

    class Widget(nn.Module):
        pass

    Widget.__module__ = "numbagrad.nn.widgets"
    monkeypatch.setattr(nn, "Widget", Widget, raising=False)
    monkeypatch.setattr(nn, "__all__", [*nn.__all__, "Widget"])
    monkeypatch.setattr(nn.utils, "__all__", [*nn.utils.__all__, "clip_everything_"])
    layers = flat(readme_lists.render_layers())
    assert "(`nn/widgets.py`): `Widget`" in layers and "`clip_everything_`" in layers

    monkeypatch.setattr(ng.Tensor, "frobnicate_", lambda self: self, raising=False)
    assert "`.frobnicate_()`" in readme_lists.render_tensor()


def test_the_op_list_marks_operators_methods_and_numpy_names():
    listed = flat(block("ops"))
    assert "`add` (`+`, `np.add`)" in listed
    assert "`matmul` (`@`, `np.matmul`)" in listed
    assert "`relu` (`x.relu()`)" in listed
    assert "`neg` (`unary -`, `np.negative`)" in listed      # a reflected dunder adds nothing
