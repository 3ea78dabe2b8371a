"""The folders ng.compile runs generated code from, and where Numba caches kernels.

Generated modules are read and written only in a folder owned by this user
with mode 0700; anything else (someone else's folder, a group- or
world-writable one, a symlink) is refused with one warning for a fresh
``tempfile.mkdtemp`` folder, and a module found there runs only if it holds
exactly the source its name is the hash of. ``import numbagrad`` works with
no writable cache location for Numba. Tests run as root here, which ignores
file modes: "someone else's folder" is made with ``os.chown`` (or, when not
root, by this process claiming another uid), and "read-only" by paths that
cannot be created even by root (under a regular file).
"""
import ast
import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import numbagrad as ng

ngc = importlib.import_module("numbagrad.compile")   # ng.compile is the function
ngc_cache = importlib.import_module("numbagrad.compile.cache")   # where the cache's state lives

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OTHER_UID = 65534          # "nobody"
SOURCE = "value = 1\n"


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """No module or refused folder remembered from other tests."""
    monkeypatch.setattr(ngc_cache, "_modules", {})
    monkeypatch.setattr(ngc_cache, "_refused", {})


def make_foreign(path, monkeypatch):
    """Make ``path`` someone else's: really (root), or by this process taking another uid."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    else:
        uid = os.geteuid() + 1
        monkeypatch.setattr(os, "geteuid", lambda: uid)


def plant(folder, name, marker):
    """A module named ``name`` in ``folder`` that leaves ``marker`` behind if it ever runs."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write(f"open({str(marker)!r}, 'w').close()\nvalue = 2\n")


def module_name(tmp_path):
    """The file name ng.compile gives SOURCE (learned from a clean load)."""
    _, path = ngc._load_module(SOURCE, str(tmp_path / "learn"))
    ngc_cache._modules.clear()
    return os.path.basename(path)


def assert_private(folder):
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid(), folder
    assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)


def load_warned(source, folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module, path = ngc._load_module(source, str(folder))
    return module, path, [str(w.message) for w in caught]


# ------------------------------------------------------------ the folder
def test_a_new_folder_is_created_private(tmp_path):
    module, path, messages = load_warned(SOURCE, tmp_path / "a" / "compiled")
    assert messages == [] and module.value == 1
    assert os.path.dirname(path) == str(tmp_path / "a" / "compiled")
    assert_private(os.path.dirname(path))


@pytest.mark.parametrize("kind", ["someone else's", "group-writable", "world-writable",
                                  "a symlink"])
def test_a_planted_module_in_an_unsafe_folder_never_runs(tmp_path, monkeypatch, kind):
    name = module_name(tmp_path)
    folder, marker = tmp_path / "shared" / "compiled", tmp_path / "planted-ran"
    if kind == "a symlink":            # to a private folder of this user holding the plant
        plant(tmp_path / "target", name, marker)
        os.chmod(tmp_path / "target", 0o700)
        folder.parent.mkdir()
        folder.symlink_to(tmp_path / "target")
    else:
        plant(folder, name, marker)
        os.chmod(folder, {"group-writable": 0o770, "world-writable": 0o777}.get(kind, 0o700))
        if kind == "someone else's":
            make_foreign(folder, monkeypatch)
    module, path, messages = load_warned(SOURCE, folder)
    assert module.value == 1 and not marker.exists()
    assert len(messages) == 1 and f"not using the cache folder {folder}" in messages[0]
    assert {"someone else's": "owned by uid", "group-writable": "mode 770",
            "world-writable": "mode 777", "a symlink": "symlink"}[kind] in messages[0]
    assert not os.path.realpath(path).startswith(str(folder.resolve()))
    assert_private(os.path.dirname(path))
    with open(path) as f:
        assert f.read() == SOURCE


def test_falling_back_warns_once(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")                   # a folder under a regular file cannot be created
    _, first, messages = load_warned(SOURCE, blocked / "compiled")
    assert len(messages) == 1 and "cannot be created" in messages[0]
    _, second, again = load_warned("value = 3\n", blocked / "compiled")
    assert again == [] and os.path.dirname(first) == os.path.dirname(second)


def test_two_users_never_share_a_folder(tmp_path, monkeypatch):
    shared = tmp_path / "shared" / "compiled"        # one NUMBAGRAD_CACHE_DIR for everyone
    _, a_path, _ = load_warned(SOURCE, shared)       # user A makes it (mode 0700)
    assert os.path.dirname(a_path) == str(shared)
    make_foreign(shared, monkeypatch)                # ... it is A's, this process is user B
    ngc_cache._modules.clear()
    module, b_path, messages = load_warned(SOURCE, shared)
    assert module.value == 1 and len(messages) == 1 and "owned by uid" in messages[0]
    assert os.path.dirname(b_path) != str(shared)
    assert os.path.commonpath([b_path, str(shared)]) != str(shared)
    assert_private(os.path.dirname(b_path))
    assert os.listdir(shared) == [os.path.basename(a_path)]    # B wrote nothing into A's


def test_a_modified_module_in_the_own_folder_is_rewritten_not_run(tmp_path):
    folder, marker = tmp_path / "compiled", tmp_path / "planted-ran"
    _, path, _ = load_warned(SOURCE, folder)
    ngc_cache._modules.clear()
    plant(folder, os.path.basename(path), marker)
    module, again, messages = load_warned(SOURCE, folder)
    assert again == path and module.value == 1 and not marker.exists()
    assert len(messages) == 1 and "does not match" in messages[0]
    with open(path) as f:
        assert f.read() == SOURCE


# ------------------------------------------------------------ a truncated compiled step
def linear_twin():
    rng = np.random.default_rng(0)
    W = ng.param(rng.normal(size=(2, 3)).astype(np.float32))
    opt = ng.optim.SGD([W], lr=0.1, momentum=0.9)
    return W, opt, lambda x, y: ng.mse_loss(W @ x, y)


def test_a_truncated_module_is_detected_and_regenerated(tmp_path):
    rng = np.random.default_rng(1)
    batches = [(ng.tensor(rng.normal(size=(3, 4)).astype(np.float32)),
                ng.tensor(rng.normal(size=(2, 4)).astype(np.float32))) for _ in range(3)]
    W1, opt1, fn1 = linear_twin()
    step = ng.compile(fn1, optimizer=opt1, cache_dir=str(tmp_path))
    step(*batches[0])
    path = step.stats[-1]["module"]
    with open(path) as f:
        full = f.read()
    lines = full.splitlines(keepends=True)
    truncated = "".join(lines[:-3])            # the last kernel calls and the return are gone
    ast.parse(truncated)                       # ... and it is still valid Python
    with open(path, "w") as f:
        f.write(truncated)
    ngc_cache._modules.clear()                 # as a new process would find it

    W2, opt2, fn2 = linear_twin()
    W3, opt3, fn3 = linear_twin()
    again = ng.compile(fn2, optimizer=opt2, cache_dir=str(tmp_path))
    with pytest.warns(RuntimeWarning, match="does not match the source hash"):
        losses = [again(x, y).item() for x, y in batches]
    assert again.stats[-1]["module"] == path
    with open(path) as f:
        assert f.read() == full
    eager = []
    for x, y in batches:
        with ng.grad_tape():
            loss = fn3(x, y)
        loss.backward()
        opt3.step()
        eager.append(loss.item())
    assert np.all(np.isfinite(losses)) and losses == eager
    assert np.array_equal(W2.numpy(), W3.numpy())


# ------------------------------------------------------------ no writable cache location
NO_CACHE_RUN = textwrap.dedent("""
    import json, os, sys, warnings
    import numba
    kernel_file = sys.argv[1]
    # the control: with no writable location, Numba refuses cache=True for a kernel file
    namespace = {}
    exec(compile("def f():\\n    return 1\\n", kernel_file, "exec"), namespace)
    try:
        numba.njit(cache=True)(namespace["f"])
        control = "cached"
    except RuntimeError as exc:
        control = str(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numpy as np
        import numbagrad as ng

        def twin():
            W = ng.param(np.linspace(-1, 1, 6).reshape(2, 3))
            opt = ng.optim.SGD([W], lr=0.1)
            return W, opt, lambda x, y: ng.mse_loss(W @ x, y)

        rng = np.random.default_rng(0)
        x, y = ng.tensor(rng.normal(size=(3, 4))), ng.tensor(rng.normal(size=(2, 4)))
        We, opte, fne = twin()
        eager = []
        for _ in range(4):
            with ng.grad_tape():
                loss = fne(x, y)
            loss.backward()
            opte.step()
            eager.append(loss.item())
        Wc, optc, fnc = twin()
        step = ng.compile(fnc, optimizer=optc)
        compiled = [step(x, y).item() for _ in range(4)]
        same = bool(np.array_equal(We.numpy(), Wc.numpy()))
        ng.compile(fnc)(x, y)       # a second generated module: no second folder warning
    cache = numba.config.CACHE_DIR
    st = os.stat(os.path.dirname(cache))
    print(json.dumps(dict(
        control=control, file=ng.__file__, cache=cache, owner=st.st_uid,
        mode=st.st_mode & 0o777, warnings=[str(w.message) for w in caught],
        eager=eager, compiled=compiled, same=same,
        indexes=sum(n.endswith(".nbi") for _, _, names in os.walk(cache) for n in names))))
""")


def test_import_and_training_work_with_no_writable_cache_location(tmp_path):
    copy = tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "numbagrad"), copy / "numbagrad",
                    ignore=shutil.ignore_patterns("__pycache__"))
    # read-only for everyone but root; for root too, a __pycache__ that is a
    # regular file makes the package's own cache folders impossible to create
    for folder, _, _ in os.walk(copy):
        with open(os.path.join(folder, "__pycache__"), "w"):
            pass
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    home = blocker / "home"                          # cannot be created either
    for folder, _, names in os.walk(copy, topdown=False):
        for name in [*names, "."]:
            os.chmod(os.path.join(folder, name), 0o555 if name == "." else 0o444)
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CACHE_DIR", "NUMBAGRAD_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), PYTHONPATH=str(copy))
    kernel_file = str(copy / "numbagrad" / "kernels" / "cpu" / "elementwise.py")
    try:
        done = subprocess.run([sys.executable, "-c", NO_CACHE_RUN, kernel_file], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=400,
                              check=False)        # cwd: not the checkout, which "-c" imports
    finally:
        for folder, _, _ in os.walk(copy):
            os.chmod(folder, 0o755)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert "no locator available" in run["control"], run["control"]
    assert run["file"] == str(copy / "numbagrad" / "__init__.py")
    numba_warnings = [m for m in run["warnings"] if "NUMBA_CACHE_DIR" in m]
    assert len(numba_warnings) == 1 and run["cache"] in numba_warnings[0], run["warnings"]
    folder_warnings = [m for m in run["warnings"] if "not using the cache folder" in m]
    assert len(folder_warnings) == 1 and str(home) in folder_warnings[0], run["warnings"]
    assert (run["owner"], run["mode"]) == (os.getuid(), 0o700)
    assert run["indexes"] > 0                        # the kernels were cached there
    assert not os.path.exists(run["cache"])          # ... and removed at exit
    assert run["eager"] == run["compiled"] and run["same"]
    assert run["eager"][-1] < run["eager"][0]


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path):
    # generated modules are written as checkpoints are: a pid-named temporary,
    # then a rename; one whose writer is gone is removed, a live one's is kept
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    target = tmp_path / "module.py"
    stale = tmp_path / f".module.py.{dead}.{'0' * 16}.tmp"
    live = tmp_path / f".module.py.{os.getppid()}.{'1' * 16}.tmp"
    other = tmp_path / f".other.py.{dead}.{'2' * 16}.tmp"
    for path in (stale, live, other):
        path.write_bytes(b"half a module")
    ngc._write(str(target), b"x = 1\n")
    assert target.read_bytes() == b"x = 1\n"
    assert not stale.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [target.name, live.name, other.name])
