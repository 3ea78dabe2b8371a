"""Every ```python block of README.md runs as written, each in a fresh
process in an empty folder, in the venv that the README's first command
makes; a block that uses CUDA runs on the simulator unless
NUMBA_ENABLE_CUDASIM=0 says a GPU is there; the MPI block also runs under
mpiexec on two ranks.

Building that venv takes minutes, so the test venv stands in for it when it
qualifies: every distribution the first command installs (its requirements
and theirs, extras and markers evaluated) is installed here at a version the
command allows. The blocks then see only those: each runs with its
site-packages replaced by a folder of links to those distributions' files
(so other packages neither import nor show in ``importlib.metadata``), and
this checkout's numbagrad. A test venv that does not qualify (or
``NUMBAGRAD_README_VENV=new``) makes the test build the venv with the first
command itself, once, under ``~/.cache/numbagrad-readme``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.DOTALL | re.MULTILINE)
COMMANDS = re.findall(r"^```bash\n(.*?)\n", README, re.MULTILINE)
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# What each block needs beyond the core (tensors, tape, matmul, mse_loss,
# optimizers): named in a failure so a block that outruns the library is
# obvious.
FEATURES = {
    "ng.nn.": "ng.nn layers (issue 8)",
    "ng.cross_entropy": "cross_entropy (issue 8)",
    "ng.softmax": "elementwise/reduction ops with broadcasting (issue 8)",
    "ng.compile": "ng.compile (issue 10)",
    'device="cuda"': "the CUDA kernels (the simulator here)",
    "numbagrad.distributed": "mpi4py and an MPI library (pip install numbagrad[mpi] mpich)",
    "sklearn": "scikit-learn (the sklearn extra)",
}
MPI_ENV = {"UCX_TLS": "self,sm", "UCX_NET_DEVICES": "lo", "HYDRA_IFACE": "lo",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
# Runs block.py (under ``--mpi`` as ``python -m mpi4py block.py`` would), after
# {isolate}: nothing, or ISOLATE.
RUNNER = """import runpy, site, sys
{isolate}
if sys.argv[1:] == ["--mpi"]:
    sys.argv = ["mpi4py", "block.py"]
    runpy.run_module("mpi4py", run_name="__main__", alter_sys=True)
else:
    runpy.run_path("block.py", run_name="__main__")
"""
# The test venv as the first command's: the standard library, this checkout,
# and the linked distributions, whose .pth files run again (what the real
# site-packages' ones imported and hooked in at startup is undone first).
ISOLATE = """started = [name for name, module in list(sys.modules.items())
           if "-packages" in str(getattr(module, "__file__", None) or "")]
sys.meta_path[:] = [f for f in sys.meta_path if f.__module__ not in started]
for name in started:
    del sys.modules[name]
sys.path[1:] = [p for p in sys.path[1:]
                if p.startswith(sys.base_prefix) and "-packages" not in p]
sys.path.insert(1, {root!r})
site.addsitedir({view!r})
"""


# ------------------------------------------------------ the first command
def setup_steps(command: str) -> list[str]:
    """A README command's steps up to its one ``pip install`` (the venv's
    making, without what it then runs)."""
    steps = command.split(" && ")
    pip = [i for i, step in enumerate(steps) if shlex.split(step)[:2] == ["pip", "install"]]
    assert len(pip) == 1, f"expected one pip install step in {command!r}"
    return steps[:pip[0] + 1]


def pip_install_step(command: str) -> list[str]:
    """The arguments of the ``pip install`` step of a README command."""
    return shlex.split(setup_steps(command)[-1])[2:]


def requested(args: list[str]) -> list[Requirement]:
    """What ``pip install args`` (run from the repository root) asks for: the
    project's own dependencies with its extras resolved, plus the other
    requirements named."""
    name = canonicalize_name(PROJECT["name"])
    optional = PROJECT.get("optional-dependencies", {})
    wanted: list[str] = []
    out = [Requirement(r) for r in PROJECT["dependencies"]]
    for arg in args:
        if arg.startswith("-"):
            continue
        if arg.startswith("."):
            wanted += Requirement(PROJECT["name"] + arg[1:]).extras
        else:
            out.append(Requirement(arg))
    done: set[str] = set()
    while wanted:
        extra = wanted.pop()
        if extra in done:
            continue
        if extra not in optional:
            raise ValueError(f"pyproject.toml has no extra {extra!r} (has {sorted(optional)})")
        done.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == name:
                wanted += req.extras
            else:
                out.append(req)
    return [r for r in out if r.marker is None or r.marker.evaluate({"extra": ""})]


def installed_closure(reqs: list[Requirement]) -> tuple[set[str], list[str]]:
    """The distributions ``reqs`` reach in this environment (their
    requirements followed, extras and markers evaluated), and what is wrong:
    a distribution missing or at a version its requirement excludes."""
    names: set[str] = set()
    problems: list[str] = []
    seen: set[tuple[str, frozenset]] = set()
    todo = list(reqs)
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req} is not installed")
            continue
        if not req.specifier.contains(dist.version, prereleases=True):
            problems.append(f"{req} wanted, {dist.version} installed")
        names.add(key[0])
        for text in dist.requires or ():
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                         for e in ("", *req.extras)):
                todo.append(dep)
    return names, sorted(set(problems))


def link_site(names: set[str], where: Path) -> Path:
    """A folder of links to the installed top-level files and folders of the
    distributions in ``names`` (a shared namespace folder such as ``nvidia``
    comes whole)."""
    where.mkdir()
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in names:
            continue
        for top in {f.parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            source, link = Path(dist.locate_file(top)), where / top
            if source.exists() and not link.is_symlink():
                link.symlink_to(source)
    return where


class Venv:
    """A Python that runs README blocks, and the code that first sets its path."""

    def __init__(self, python: str, isolate: str = "") -> None:
        self.python, self.isolate = python, isolate


def build_venv(command: str, why: str) -> Venv:
    """The venv that the README's first command makes (without its last
    step, the benchmark), built once per version of the command and the
    project's requirements; ``why`` the test venv does not do."""
    key = hashlib.sha256((command + repr(PROJECT["dependencies"]) +
                          repr(PROJECT.get("optional-dependencies"))).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    where = cache / "numbagrad-readme" / key
    python = where / "bin" / "python"
    if not (where / "complete").exists():
        shutil.rmtree(where, ignore_errors=True)
        where.parent.mkdir(parents=True, exist_ok=True)
        script = " && ".join(setup_steps(command)).replace(".venv", shlex.quote(str(where)))
        result = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True,
                                text=True, timeout=3600, stdin=subprocess.DEVNULL, check=False)
        assert result.returncode == 0, (f"building the README's venv ({why}) failed: {script}\n"
                                        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        (where / "complete").write_text(script + "\n")
    return Venv(str(python))


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    command = COMMANDS[0]
    names, problems = installed_closure(requested(pip_install_step(command)))
    if problems:
        return build_venv(command, "the test venv lacks " + "; ".join(problems))
    if os.environ.get("NUMBAGRAD_README_VENV") == "new":
        return build_venv(command, "NUMBAGRAD_README_VENV=new")
    names.add("pip")                                    # (python3 -m venv installs pip)
    names.discard(canonicalize_name(PROJECT["name"]))   # the checkout's, not an install's
    view = link_site(names, tmp_path_factory.mktemp("readme") / "site-packages")
    return Venv(sys.executable, ISOLATE.format(root=str(ROOT), view=str(view)))


def run(code: str, tmp_path: Path, venv: Venv, prefix: tuple = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, **MPI_ENV)
    env.pop("PYTHONPATH", None)
    if 'device="cuda"' in code:
        env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    (tmp_path / "block.py").write_text(code)
    (tmp_path / "run_block.py").write_text(RUNNER.format(isolate=venv.isolate))
    return subprocess.run([*prefix, venv.python, "run_block.py", *(["--mpi"] if prefix else [])],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, check=False)


def explain(code: str, result: subprocess.CompletedProcess) -> str:
    needs = [what for key, what in FEATURES.items() if key in code]
    return (f"README block failed (it needs: {', '.join(needs) or 'the core only'})\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


# ------------------------------------------------------------------ tests
def test_the_readme_has_its_blocks():
    assert len(BLOCKS) >= 5
    assert any("numbagrad.distributed" in b for b in BLOCKS)
    assert any('device="cuda"' in b for b in BLOCKS)
    assert any("from sklearn" in b for b in BLOCKS)
    assert "NUMBA_ENABLE_CUDASIM=1" in README and '".[cuda]"' in README
    assert "Verdict" in README             # the benchmark's sample output


def test_the_test_command_installs_what_the_first_does():
    """The README's second command (CI's, verbatim) makes a venv the README
    test can use as the first command's."""
    first, second = (requested(pip_install_step(c)) for c in COMMANDS[:2])
    assert {str(r) for r in first} - {str(r) for r in second} == set()
    assert COMMANDS[1] in (ROOT / ".ci" / "run").read_text().splitlines()
    names = {canonicalize_name(r.name) for r in first}
    assert {"scikit-learn", "numba-cuda", "mpi4py", "mpich"} <= names


def test_the_venv_check_names_what_is_missing_or_at_a_wrong_version():
    names, problems = installed_closure([Requirement("numpy<1"),
                                         Requirement("no-such-distribution-xyz")])
    assert "numpy" in names
    assert any(p.startswith("numpy<1 wanted") for p in problems), problems
    assert "no-such-distribution-xyz is not installed" in problems
    assert installed_closure([Requirement("numpy")])[1] == []


def test_the_venv_is_built_by_the_command_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    command = ("python3 -m venv --without-pip .venv && pip install --help"
               " && python scripts/bench.py --quick")
    built = build_venv(command, "a test")
    assert Path(built.python).exists() and built.isolate == ""
    made = next(tmp_path.glob("numbagrad-readme/*/complete")).read_text()
    assert made.startswith("python3 -m venv --without-pip " + str(tmp_path))
    assert made.rstrip().endswith("pip install --help")      # not the benchmark
    (Path(built.python).parent / "mark").write_text("")
    assert build_venv(command, "a test").python == built.python     # reused, not rebuilt
    assert (Path(built.python).parent / "mark").exists()


def test_a_package_the_first_command_does_not_install_is_hidden(tmp_path, venv):
    result = run("import pytest\n", tmp_path, venv)
    assert result.returncode != 0 and "No module named 'pytest'" in result.stderr
    result = run("import importlib.metadata as m, numbagrad, sklearn\n"
                 "print(numbagrad.__file__)\nprint(m.version('scikit-learn'))\n"
                 "m.version('hypothesis')\n", tmp_path, venv)
    assert result.stdout.startswith(str(ROOT)), result.stderr       # this checkout's numbagrad
    assert "PackageNotFoundError: No package metadata was found for hypothesis" in result.stderr


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs_as_written(code, tmp_path, venv):
    result = run(code, tmp_path, venv)
    assert result.returncode == 0, explain(code, result)


@pytest.mark.mpi
def test_readme_mpi_block_runs_on_two_ranks(tmp_path, venv):
    python_dir = os.path.dirname(venv.python)
    mpiexec = shutil.which("mpiexec", path=python_dir) or shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found: pip install mpich (or use the cluster's MPI)"
    code = next(b for b in BLOCKS if "numbagrad.distributed" in b)
    result = run(code, tmp_path, venv, prefix=(mpiexec, "-n", "2"))
    assert result.returncode == 0, explain(code, result)
    assert "2 rank(s)" in result.stdout
