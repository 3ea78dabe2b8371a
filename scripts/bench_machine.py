"""The machine the benchmark runs on: its CPU, cores and library versions,
the BLAS each peer process loaded (threadpoolctl) and the OpenBLAS kernel
variables that force an older kernel, and this process's thread pools.

Standard library only at import: the peer processes import it too (through
``bench_cases``), and the parent imports none of the peers' libraries.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys

# The variables these machines set for old OpenBLAS builds, which force an
# older kernel on newer CPUs (AVX2's Haswell on AVX-512: GEMMs at half speed).
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it."""
    return importlib.util.find_spec(module) is not None


BLAS_PROBE = ("import json, numpy, scipy.linalg, threadpoolctl; print(json.dumps("
              "[lib.get('architecture') for lib in threadpoolctl.threadpool_info()"
              " if lib['user_api'] == 'blas']))")


def blas_kernels(env: dict[str, str]) -> list[str] | None:
    """The OpenBLAS kernels NumPy's and SciPy's BLAS pick in a process with
    ``env`` (threadpoolctl's ``architecture``), or None without threadpoolctl."""
    if not installed("threadpoolctl"):
        return None
    run = subprocess.run([sys.executable, "-c", BLAS_PROBE], env=env, capture_output=True,
                         text=True, stdin=subprocess.DEVNULL, check=False, timeout=120)
    return json.loads(run.stdout) if run.returncode == 0 else None


def blas_environment(keep: bool) -> tuple[dict[str, str], dict]:
    """(the environment the peers' processes get, what was found and done).

    When ``OPENBLAS_CORETYPE`` (or ``OPENBLAS_L2_SIZE``) is set, the kernel it
    forces is compared with the one OpenBLAS picks for this CPU by itself; if
    they differ the run warns and, unless ``keep``, runs its children without
    those variables, as the library's users run."""
    env = dict(os.environ)
    found = {k: env[k] for k in BLAS_ENV if k in env}
    report = {"variables": found, "kept": keep, "forced": None, "native": None,
              "removed": False, "warning": None}
    if not found:
        return env, report
    native_env = {k: v for k, v in env.items() if k not in BLAS_ENV}
    report["forced"], report["native"] = blas_kernels(env), blas_kernels(native_env)
    if report["forced"] != report["native"]:
        what = " ".join(f"{k}={v}" for k, v in found.items())
        report["warning"] = (f"WARNING: {what} forces OpenBLAS kernel(s) {report['forced']}; "
                             f"this CPU's own is {report['native']}"
                             + ("; kept (--keep-blas-env): every BLAS figure is slower than "
                                "users see" if keep else
                                "; the peers run without those variables (--keep-blas-env "
                                "keeps them)"))
    if not keep:
        env, report["removed"] = native_env, True
    return env, report


def machine_info() -> dict:
    """The CPU, its cores (all and usable), the platform and the versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh
                        if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    from importlib import metadata
    versions = {"python": platform.python_version()}
    for name in ("numbagrad", "numpy", "numba", "llvmlite", "scipy", "torch", "jax", "jaxlib",
                 "optax", "tinygrad", "autograd", "mygrad"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable,
            "platform": platform.platform(), "versions": versions, "processes": {}}


def blas_summary(info: dict) -> str:
    """The BLAS numbagrad's process runs (SciPy's: numbagrad's GEMMs and the
    floor's), as threadpoolctl names it, with its kernel."""
    libs = [lib for p in info.get("processes", {}).values() for lib in p.get("blas", [])
            if lib["user_api"] == "blas"]
    mine = [lib for lib in libs if "scipy.libs" in (lib["filepath"] or "")] or libs
    if not mine:
        return "BLAS unknown (pip install threadpoolctl)"
    lib = mine[0]
    return (f"{lib['internal_api']} {lib['version']}, kernel {lib['architecture']} "
            f"({lib['num_threads']} threads)")


def process_summary(info: dict) -> list[str]:
    """One line per peer process: its BLAS libraries, versions and kernels."""
    out = []
    for group, p in info.get("processes", {}).items():
        libs = ", ".join(f"{os.path.basename(lib['filepath'] or '?')} {lib['version']} "
                         f"kernel {lib['architecture']}, {lib['num_threads']} threads"
                         for lib in p.get("blas", []) if lib["user_api"] == "blas")
        out.append(f"  {group:<15} {libs or 'no BLAS that threadpoolctl sees'}")
    return out


def limit_threads(n: int) -> None:
    """This process's thread pools to n threads (``--in-process``; a peer
    process limits its own with ``bench_peers.limit_threads``)."""
    from bench_peers import limit_threads as limit_env
    limit_env(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(n)
    except ImportError:
        print("threadpoolctl not installed: --threads cannot limit the BLAS")

