"""Damaged caches: a cache entry that is not a regular file, a truncated Numba cache file.

A FIFO where ng.compile's generated module goes made ``ng.compile`` block
forever on opening it, and a truncated Numba index or data file made every
call of its kernel raise ``EOFError`` or ``UnpicklingError``. Each is now
detected, warned about once, and rebuilt. What could hang runs in a
subprocess under a timeout, so a regression fails instead of stalling the
suite; Numba's cache folder is fixed at import, so those runs are
subprocesses too, each with its own copy of a cache folder warmed once.
"""
import glob
import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings

import numba
import pytest
from numba.core import caching

import numbagrad as ng  # noqa: F401 (installs the guard of Numba's cache files)

ng_cache = importlib.import_module("numbagrad._cache")
ngc = importlib.import_module("numbagrad.compile")
ngc_cache = importlib.import_module("numbagrad.compile.cache")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "value = 1\n"
TIMEOUT = 300          # a cold compile on a busy machine takes a minute; a hang takes forever


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """No module or refused folder remembered from other tests."""
    monkeypatch.setattr(ngc_cache, "_modules", {})
    monkeypatch.setattr(ngc_cache, "_refused", {})


def run_python(script, tmp_path, *args, numba_cache=None):
    """Run ``script`` with this checkout's numbagrad in a fresh interpreter; its last stdout line
    is JSON. ``numba_cache``: NUMBA_CACHE_DIR for it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = str(numba_cache)
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------ ng.compile's cache
FIFO_STEP = textwrap.dedent("""
    import json, os, stat, sys, warnings
    import numpy as np
    import numbagrad as ng
    from numbagrad.compile import cache
    first, second = sys.argv[1], sys.argv[2]

    def twin():
        W = ng.param(np.linspace(-1, 1, 6).reshape(2, 3))
        opt = ng.optim.SGD([W], lr=0.1)
        return W, opt, lambda x, y: ng.mse_loss(W @ x, y)

    rng = np.random.default_rng(0)
    x, y = ng.tensor(rng.normal(size=(3, 4))), ng.tensor(rng.normal(size=(2, 4)))
    W, opt, fn = twin()
    step = ng.compile(fn, optimizer=opt, cache_dir=first)
    step(x, y)
    name = os.path.basename(step.stats[-1]["module"])   # where this step's module goes
    cache._modules.clear()                              # as a new process would find it
    folder = os.path.join(second, "compiled")
    os.makedirs(folder, 0o700)
    fifo = os.path.join(folder, name)
    os.mkfifo(fifo)
    We, opte, fne = twin()
    eager = []
    for _ in range(3):
        with ng.grad_tape():
            loss = fne(x, y)
        loss.backward()
        opte.step()
        eager.append(loss.item())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Wc, optc, fnc = twin()
        step = ng.compile(fnc, optimizer=optc, cache_dir=second)
        compiled = [step(x, y).item() for _ in range(3)]
        module = step.stats[-1]["module"]
        W2, opt2, fn2 = twin()
        ng.compile(fn2, optimizer=opt2, cache_dir=second)(x, y)   # the same module again
    with open(fifo, "rb", opener=lambda p, f: os.open(p, f | os.O_NONBLOCK)) as f:
        regular, held = stat.S_ISREG(os.fstat(f.fileno()).st_mode), f.read()
    print(json.dumps(dict(fifo=fifo, module=module, eager=eager, compiled=compiled,
                          same=bool(np.array_equal(We.numpy(), Wc.numpy())),
                          warnings=[str(w.message) for w in caught], regular=regular,
                          held=held.decode(errors="replace"))))
""")


def test_a_fifo_in_place_of_a_compiled_module_is_replaced_not_opened(tmp_path):
    run = run_python(FIFO_STEP, tmp_path, tmp_path / "first", tmp_path / "second")
    assert run["compiled"] == run["eager"] and run["same"]
    assert run["module"] == run["fifo"]                      # cached there again
    assert len(run["warnings"]) == 1, run["warnings"]
    assert run["fifo"] in run["warnings"][0]
    assert "not a regular file (a FIFO)" in run["warnings"][0]
    assert run["regular"] and "def step(" in run["held"]


def load_warned(source, folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module, path = ngc._load_module(source, str(folder))
    return module, path, [str(w.message) for w in caught]


def test_a_folder_in_place_of_a_module_runs_the_step_uncached_with_one_warning(tmp_path):
    folder = tmp_path / "compiled"
    _, path = ngc._load_module(SOURCE, str(tmp_path / "learn"))
    ngc_cache._modules.clear()
    entry = folder / os.path.basename(path)
    (entry / "inside").mkdir(parents=True)                  # a name nothing can replace
    os.chmod(folder, 0o700)
    module, where, messages = load_warned(SOURCE, folder)
    assert module.value == 1 and where == ""                 # run from memory
    assert len(messages) == 1, messages
    assert str(entry) in messages[0] and "not a regular file (a folder)" in messages[0]
    assert "not cached on disk" in messages[0]
    module, where, messages = load_warned(SOURCE, folder)   # the next compile: no new warning
    assert module.value == 1 and where == "" and messages == []
    assert os.listdir(folder) == [entry.name] and ngc_cache._refused == {}   # folder still used


# ------------------------------------------------------------ Numba's cache files
# ng.cat: a kernel that compiles in a second (the test is about the cache
# files, not the kernel; an elementwise ladder would take tens of seconds)
CAT = textwrap.dedent("""
    import json, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numpy as np
        import numbagrad as ng
        a = np.arange(12.0).reshape(3, 4)
        b = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
        out = ng.cat([ng.tensor(a), ng.tensor(b)]).numpy()
    print(json.dumps(dict(right=bool(np.array_equal(out, np.concatenate([a, b]))),
                          warnings=[str(w.message) for w in caught])))
""")


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A NUMBA_CACHE_DIR holding the kernels of ``ng.cat`` (and nothing else: compiled once)."""
    tmp = tmp_path_factory.mktemp("warm")
    run = run_python(CAT, tmp, numba_cache=tmp / "numba")
    assert run == dict(right=True, warnings=[]), run
    files = sorted(glob.glob(str(tmp / "numba" / "**" / "*.nb[ic]"), recursive=True))
    assert any(f.endswith(".nbi") for f in files) and any(f.endswith(".nbc") for f in files)
    return tmp / "numba"


def damage(cache, what):
    """Damage every index (``*.nbi``) or data file (``*.nbc``) in ``cache`` as ``what`` says;
    the paths damaged. Every file: whichever kernel ``ng.cat`` dispatches to is hit."""
    index_only = what in ("truncated index", "fifo index", "folder index")
    pattern = "*.nbi" if index_only else "*.nbc" if what == "truncated data" else "*.nb[ic]"
    paths = sorted(glob.glob(str(cache / "**" / pattern), recursive=True))
    for path in paths:
        size = os.path.getsize(path)
        if what.startswith("truncated"):
            os.truncate(path, size // 2)
        elif what == "every file emptied":
            os.truncate(path, 0)
        else:
            os.unlink(path)
            if what == "fifo index":
                os.mkfifo(path)
            else:
                os.mkdir(path)
    return paths


@pytest.mark.parametrize("what", ["truncated index", "truncated data", "every file emptied",
                                  "fifo index", "folder index"])
def test_a_damaged_numba_cache_file_is_rebuilt_with_one_warning(warm_cache, tmp_path, what):
    cache = tmp_path / "numba"
    shutil.copytree(warm_cache, cache)
    damaged = damage(cache, what)
    run = run_python(CAT, tmp_path, numba_cache=cache)
    assert run["right"], run
    assert len(run["warnings"]) == 1, run["warnings"]
    message = run["warnings"][0]
    assert "Numba cache file" in message and any(path in message for path in damaged), message
    hit = next(path for path in damaged if path in message)
    if what == "folder index":            # cannot be removed: that kernel runs uncached
        assert "cannot be removed" in message and os.path.isdir(hit)
        return
    assert ("not a regular file" if what == "fifo index" else "Error") in message
    assert stat.S_ISREG(os.stat(hit).st_mode) and os.path.getsize(hit) > 0   # written anew
    again = run_python(CAT, tmp_path, numba_cache=cache)    # ... and loads cleanly
    assert again == dict(right=True, warnings=[]), again


# ------------------------------------------------------------ the guard's calibration
def test_the_guard_is_installed_on_this_numba():
    assert ng_cache.numba_cache_guarded
    assert getattr(caching.IndexDataCacheFile.load, "_numbagrad_guard", False)
    assert getattr(caching.IndexDataCacheFile.save, "__wrapped__", None) is not None


class _Renamed:
    """An IndexDataCacheFile whose internals moved (as a later Numba might have them)."""

    def __init__(self, cache_path, filename_base, source_stamp):
        self._path = cache_path

    def load(self, key):
        return None

    def save(self, key, data):
        return None


class _Reshaped(_Renamed):
    """The same names, other parameters."""

    def _load_index(self):
        return {}

    def _load_data(self, name, extra):
        return None

    def _data_path(self, name):
        return name


@pytest.mark.parametrize("cls", [_Renamed, _Reshaped])
def test_an_unexpected_numba_leaves_its_cache_class_untouched(monkeypatch, cls):
    monkeypatch.setattr(caching, "IndexDataCacheFile", cls)
    load, save = cls.load, cls.save
    assert ng_cache.guard_numba_cache() is False
    assert cls.load is load and cls.save is save
    monkeypatch.delattr(caching, "IndexDataCacheFile")
    assert ng_cache.guard_numba_cache() is False


# ------------------------------------------------------------ generated functions
LADDER = textwrap.dedent("""
    import json, sys
    from numba import njit
    from numbagrad.kernels import dispatch
    fn = njit(cache=True)(dispatch.ladder(
        "_probe", "x", [0, 1], "return x + {code} * STEP", dict(STEP=float(sys.argv[1])),
        "unknown", origin="numbagrad.kernels.cpu.elementwise"))
    print(json.dumps(dict(value=fn(1, 2.0), hits=sum(fn.stats.cache_hits.values()),
                          misses=sum(fn.stats.cache_misses.values()))))
""")


def _ladder_run(cache, step):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    run = subprocess.run([sys.executable, "-c", LADDER, str(step)], env=env, capture_output=True,
                         text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_generated_ladder_is_cached_beside_the_module_that_made_it(tmp_path):
    # what lets a kernel compiled for a new signature reuse the ~20 s ladder
    # blocks, in this process or a later one
    assert ng_cache.generated_cached
    assert _ladder_run(tmp_path, 10) == dict(value=12.0, hits=0, misses=1)
    assert _ladder_run(tmp_path, 10) == dict(value=12.0, hits=1, misses=0)
    assert glob.glob(str(tmp_path / "*" / "elementwise-_probe.*.nbi"))
    # the same source with other constants is other code: compiled, never the cached one
    assert _ladder_run(tmp_path, 100) == dict(value=102.0, hits=0, misses=1)


def test_an_unexpected_numba_caches_no_generated_function(monkeypatch):
    from numbagrad.kernels import dispatch
    # a ladder no locator takes (not a numbagrad module's) compiles uncached
    fn = ng_cache.jit_generated(dispatch.ladder("_probe", "x", [0], "return x + 1.0", {}, "unknown",
                                                origin="a_module_of_the_users"))
    assert fn(0, 1.0) == 2.0 and type(fn._cache).__name__ == "NullCache"
    monkeypatch.setattr(numba.config, "CACHE_LOCATOR_CLASSES", "InTreeCacheLocator",
                        raising=False)     # the user's own list of locators: left alone
    assert ng_cache.locate_generated() is False
    monkeypatch.setattr(numba.config, "CACHE_LOCATOR_CLASSES", "", raising=False)
    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", tuple(
        caching.CacheImpl._locator_classes))
    assert ng_cache.locate_generated() is False
