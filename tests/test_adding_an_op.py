"""docs/adding_an_op.md is followed as written: its blocks are applied to a
scratch copy of the package, and the ops they make run forward and backward
on the CPU and on CUDA (the simulator) in a fresh process. So the recipes
stay true: a new elementwise code is its record and its row, a new kernel
family its modules and its row."""
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import numbagrad as ng

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding_an_op.md"
PLACE = re.compile(r"# (?P<path>\S+), (?:(?P<new>new file)|above the line: (?P<anchor>.+))$")


def blocks() -> list[tuple[str, str | None, str]]:
    """(path, anchor or None for a new file, text) for every placed block."""
    out = []
    for body in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S):
        first, _, rest = body.partition("\n")
        m = PLACE.match(first)
        assert m, f"docs/adding_an_op.md: a python block says where it goes first: {first!r}"
        out.append((m["path"], None if m["new"] else m["anchor"], rest))
    return out


def apply(root: Path, path: str, anchor: str | None, text: str) -> None:
    target = root / path
    if anchor is None:
        assert not target.exists(), f"{path} exists: the example must be an op the package lacks"
        target.write_text(text)
        return
    lines = target.read_text().splitlines(True)
    at = next((i for i, line in enumerate(lines) if line.strip().startswith(anchor)), None)
    assert at is not None, f"docs/adding_an_op.md: no line of {path} starts with {anchor!r}"
    lines[at:at] = [text if text.endswith("\n") else text + "\n"]
    target.write_text("".join(lines))


def test_the_doc_places_every_block():
    placed = blocks()
    assert {p for p, _, _ in placed} >= {"numbagrad/kernels/codes.py", "numbagrad/ops/table.py",
                                         "numbagrad/kernels/cpu/flip_last.py",
                                         "numbagrad/kernels/cuda/flip_last.py",
                                         "numbagrad/ops/flip_last.py"}
    for path, anchor, _ in placed:
        if anchor is not None:
            lines = (ROOT / path).read_text().splitlines()
            assert any(line.strip().startswith(anchor) for line in lines), (path, anchor)


# Only kernels the edits touch compile again (the unary ones, flip_last);
# the loss is a logsumexp, whose kernels never see the records (cached), so
# each op's backward gets a gradient that is not all ones.
CHECK = textwrap.dedent("""
    import sys
    import numpy as np
    import numbagrad as ng
    from numbagrad import kernels
    assert ng.__file__.startswith(sys.argv[1]), ng.__file__
    cases = [("cpu", np.float64)]
    if ng.cuda_available():
        cases += [("cuda", np.float64), ("cuda", np.float32)]
    x0 = np.random.default_rng(0).normal(size=(3, 5))
    for device, dt in cases:
        xv = x0.astype(dt)
        x = ng.param(xv, device=device)
        for _ in range(2):                    # the gradient accumulates in x.grad
            with ng.grad_tape():
                loss = ng.logsumexp(x.square().flip_last())
            ng.backward(loss)
        z = (xv * xv)[:, ::-1]
        soft = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        want = 2 * soft[:, ::-1] * 2 * xv     # two calls of d/dx logsumexp(flip(x^2))
        tol = 1e-12 if dt == np.float64 else 1e-5
        np.testing.assert_allclose(ng.square(x).numpy(), xv * xv, rtol=tol)
        np.testing.assert_allclose(x.flip_last().numpy(), xv[:, ::-1])
        np.testing.assert_allclose(x.grad, want, rtol=tol, atol=tol)
        assert "flip_last" in kernels.get(device).KERNELS
    print("ok", cases)
""")



@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_following_the_recipes_makes_working_ops(tmp_path):
    scratch = tmp_path / "tree"
    # the copy keeps Numba's cache files (__pycache__): only what the edits
    # touch compiles again
    shutil.copytree(ROOT / "numbagrad", scratch / "numbagrad", symlinks=True)
    for path, anchor, text in blocks():
        apply(scratch, path, anchor, text)
    env = dict(os.environ, PYTHONPATH=str(scratch))
    if ng.cuda_available():
        env["NUMBA_ENABLE_CUDASIM"] = os.environ.get("NUMBA_ENABLE_CUDASIM", "1")
    proc = subprocess.run([sys.executable, "-c", CHECK, str(scratch)], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok"), proc.stdout
