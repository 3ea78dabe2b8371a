"""The kernels' settings and setup: one reader for the environment's integers,
one threads threshold for op and optimizer kernels, CUDA reported unusable
(naming the ``cuda`` extra) where numba-cuda is missing, the threads timing
script, and ``Module._parameters``."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import numbagrad as ng
from numbagrad import kernels
from numbagrad.kernels import cpu
from numbagrad.kernels.cpu import _threads
from numbagrad.kernels.cpu import optim as cpu_optim

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import time_threads  # noqa: E402


def test_env_int_reads_checks_and_names_the_variable(monkeypatch):
    monkeypatch.delenv("NUMBAGRAD_TEST_INT", raising=False)
    assert kernels.env_int("NUMBAGRAD_TEST_INT", 7) == 7
    monkeypatch.setenv("NUMBAGRAD_TEST_INT", "0")
    assert kernels.env_int("NUMBAGRAD_TEST_INT", 7) == 0
    with pytest.raises(ValueError, match=r"NUMBAGRAD_TEST_INT must be an integer >= 1, got 0"):
        kernels.env_int("NUMBAGRAD_TEST_INT", 7, minimum=1)
    monkeypatch.setenv("NUMBAGRAD_TEST_INT", "lots")
    with pytest.raises(ValueError, match=r"NUMBAGRAD_TEST_INT must be an integer >= 0, got 'lots'"):
        kernels.env_int("NUMBAGRAD_TEST_INT", 7)


def test_no_module_keeps_its_own_env_reader():
    sources = sorted((ROOT / "numbagrad").rglob("*.py"))
    assert [p for p in sources if "def _env_int" in p.read_text()] == []
    readers = [p for p in sources if "NUMBAGRAD_PARALLEL_MIN\"" in p.read_text()]
    assert readers == [ROOT / "numbagrad" / "kernels" / "cpu" / "_threads.py"]


def test_the_optimizer_kernels_follow_the_op_kernels_threshold(monkeypatch):
    monkeypatch.setattr(cpu_optim.numba, "get_num_threads", lambda: 2)
    # threads allowed, whatever the governor makes of this machine's load now
    # (tests/test_threads_load.py checks that its switch turns them off)
    monkeypatch.setattr(cpu_optim, "ALLOWED", np.ones(1, np.int64))
    assert cpu.MT_MIN == _threads.MT_MIN
    monkeypatch.setattr(cpu, "MT_MIN", 100)
    assert not cpu_optim._threaded(99) and cpu_optim._threaded(100)
    monkeypatch.setattr(cpu, "MT_MIN", _threads.NEVER)
    assert not cpu_optim._threaded(1 << 40)
    monkeypatch.setattr(cpu, "MT_MIN", 1)
    monkeypatch.setattr(cpu_optim.numba, "get_num_threads", lambda: 1)
    assert not cpu_optim._threaded(1 << 20)


def test_the_threshold_comes_from_the_environment_once():
    code = ("from numbagrad.kernels import cpu; from numbagrad.kernels.cpu import optim;"
            "print(cpu.MT_MIN, optim._threaded(1 << 20))")
    # (no governor: under load it would switch the threads off)
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2",
               NUMBAGRAD_THREAD_GOVERNOR="0")
    out = {}
    for value in ("0", "4096"):
        env["NUMBAGRAD_PARALLEL_MIN"] = value
        out[value] = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                    text=True, check=True, timeout=120).stdout.split()
    assert out["0"] == [str(_threads.NEVER), "False"]
    assert out["4096"] == ["4096", "True"]


# Hides numba-cuda as if it were not installed: its module unimportable and its
# redirect of numba.cuda (a meta path finder its .pth installs) removed.
WITHOUT_NUMBA_CUDA = """
import sys
sys.modules["numba_cuda"] = None
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != "_numba_cuda_redirector"]
"""
CUDA_PROBE = """
import numpy as np
import numbagrad as ng
print(ng.cuda_available())
print(ng.kernels.cuda_unavailable_reason())
try:
    ng.tensor(np.zeros(2, np.float32), device="cuda")
except RuntimeError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("hide", [True, False], ids=["without-numba-cuda", "with"])
def test_cuda_is_unavailable_without_numba_cuda_even_on_the_simulator(hide):
    if not hide and not ng.cuda_available():
        pytest.skip("CUDA unusable here: " + str(kernels.cuda_unavailable_reason()))
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_ENABLE_CUDASIM="1")
    code = (WITHOUT_NUMBA_CUDA if hide else "") + CUDA_PROBE
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    if hide:
        assert lines[0] == "False"
        assert "numba-cuda is not installed" in lines[1] and '"numbagrad[cuda]"' in lines[1]
        assert lines[2].startswith('refused: device "cuda" requested but not usable: numba-cuda')
    else:
        assert lines[:2] == ["True", "None"] and len(lines) == 2


def test_the_timing_script_times_both_twins(capsys):
    time_threads.main(["--exponents", "12", "12", "--blocks", "1", "--dtypes", "float64",
                       "--only", "relu", "add"])
    time_threads.main(["--optim", "--exponents", "12", "12", "--blocks", "1", "--dtypes",
                       "float32", "--only", "sgd"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("float64 2^12: relu ") and " | add " in lines[1]
    assert lines[3].startswith("float32 2^12: sgd ") and "|" not in lines[3]
    with pytest.raises(SystemExit):
        time_threads.main(["--exponents", "12", "11"])


def test_modules_register_params_in_parameters_as_pytorch_names_it():
    model = ng.nn.Sequential(ng.nn.Linear(3, 2, rng=np.random.default_rng(0)), ng.nn.ReLU())
    layer = model[0]
    assert list(layer._parameters) == ["weight", "bias"]
    assert layer._parameters["weight"] is layer.weight
    assert not hasattr(layer, "_params")
    assert list(model.state_dict()) == ["0.weight", "0.bias"]    # the keys are unchanged
