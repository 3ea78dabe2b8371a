"""Zero-copy interop: DLPack and the CUDA Array Interface, both directions.

In: ``ng.from_dlpack(x)`` wraps a PyTorch, CuPy, JAX or NumPy array
without a copy, unless it is read-only (below): CPU producers through
NumPy's ``np.from_dlpack``, CUDA producers through numba-cuda, by their
``__cuda_array_interface__`` or else their ``__dlpack__``; and
``ng.as_tensor`` wraps any ``__cuda_array_interface__``
object as a "cuda" tensor. Out: a "cpu" tensor's ``__dlpack__`` hands out
its NumPy array's capsule (``torch.from_dlpack(t)``, ``np.from_dlpack(t)``);
a "cuda" tensor exposes its device array's ``__cuda_array_interface__``
(``torch.as_tensor(t, device="cuda")``, ``cupy.asarray(t)``). numba-cuda's
device arrays have no DLPack producer, so a "cuda" tensor's ``__dlpack__``
raises ``BufferError`` naming that interface instead.

The tensors' rules hold for whatever comes in: float32/float64, any rank,
C-contiguous and writable, or a clear error and no copy (``ng.tensor``
copies). Where NumPy and PyTorch differ on the producer's flags: a
read-only producer (a JAX array, a read-only NumPy array) is refused, where
``np.from_dlpack`` returns a read-only array and ``torch.from_dlpack`` ignores
the flag, because Numba's kernels cannot take read-only arrays and writing
through a shared view would break the producer's promise. A non-contiguous
producer is refused, where PyTorch would share a strided view: numbagrad's
kernels need C-contiguous data, and a hidden copy would not share memory.

Under Numba's CUDA simulator "device" memory is host memory: the
``__cuda_array_interface__`` of a simulated tensor, and the one it wraps,
carry host addresses, so both directions work there too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .tensor import Tensor, _wrap, as_tensor

_KDL_CPU, _KDL_CUDA = 1, 2      # DLPack's DLDeviceType codes


def from_dlpack(obj: Any) -> Tensor:
    """A tensor sharing memory with ``obj``, a DLPack or CUDA Array Interface producer.

    Like ``torch.from_dlpack``: PyTorch, CuPy and NumPy arrays, and
    numbagrad tensors, come in without a copy, on "cpu" or "cuda" as the
    producer's memory is (JAX arrays too where JAX does not mark them
    read-only; on the CPU it does). Refused, with the reason: dtypes a tensor
    does not hold (complex), non-contiguous or read-only producers
    (see the module docstring), a tensor that requires grad (as PyTorch's
    ``__dlpack__`` refuses one). A tensor wrapping a param's ``.grad`` is
    tracked as ``ng.as_tensor(W.grad)`` is.
    """
    if isinstance(obj, Tensor):
        check_exportable(obj, "from_dlpack")
        return _wrap(obj.data, obj._kern)
    if isinstance(obj, np.ndarray) or type(obj).__module__.startswith("numba.cuda"):
        array = obj            # as_tensor takes these as they are (and tracks a .grad)
    elif hasattr(obj, "__dlpack_device__") and hasattr(obj, "__dlpack__"):
        kind, _ = obj.__dlpack_device__()
        if kind == _KDL_CPU:
            array = np.from_dlpack(obj)
        elif kind == _KDL_CUDA:
            array = cuda_array(obj, "from_dlpack")
        else:
            raise ValueError(f"from_dlpack: {_name(obj)} is on DLPack device type "
                             f"{int(kind)}; numbagrad takes kDLCPU (1) and kDLCUDA (2)")
    elif hasattr(obj, "__cuda_array_interface__"):
        array = cuda_array(obj, "from_dlpack")
    else:
        raise TypeError(f"from_dlpack needs an object with __dlpack__ and __dlpack_device__ "
                        f"or __cuda_array_interface__, got {_name(obj)}")
    if isinstance(array, np.ndarray) and not array.flags.writeable:
        raise ValueError(f"from_dlpack: {_name(obj)} is read-only (shape "
                         f"{array.shape}, dtype {array.dtype}); numbagrad's kernels need "
                         "writable memory: copy it with ng.tensor")
    try:
        return as_tensor(array)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"from_dlpack: {_name(obj)} of shape {tuple(array.shape)}, "
                        f"dtype {array.dtype}: {exc}") from None


def cuda_array(obj: Any, what: str) -> Any:
    """A Numba device array viewing ``obj``'s CUDA memory (no copy).

    By ``__cuda_array_interface__`` when ``obj`` has one (numba-cuda's own
    import), else by ``__dlpack__`` through cuda.core's ``StridedMemoryView``
    (what numba-cuda uses to take DLPack kernel arguments). The array holds a
    reference that keeps ``obj``'s memory alive.
    """
    from numba import cuda
    iface = getattr(obj, "__cuda_array_interface__", None)
    if iface is not None:
        if iface.get("mask") is not None:
            raise ValueError(f"{what}: {_name(obj)} is a masked array (its "
                             "__cuda_array_interface__ has a mask); numbagrad has no masks")
        if iface["data"][1]:
            raise ValueError(f"{what}: {_name(obj)} is read-only (its "
                             "__cuda_array_interface__ says so); numbagrad's kernels need "
                             "writable memory: copy it with ng.tensor")
        if _simulated():
            return _simulated_view(obj, iface)
        return cuda.as_cuda_array(obj)
    if _simulated():
        raise TypeError(f"{what}: {_name(obj)} has no __cuda_array_interface__ and Numba's "
                        "CUDA simulator cannot import a CUDA DLPack capsule")
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError:
        try:
            from cuda.core.experimental.utils import StridedMemoryView
        except ImportError as exc:
            raise ImportError(f"{what}: a CUDA DLPack producer needs cuda.core (numba-cuda's "
                              f"dependency; install numbagrad[cuda]): {exc}") from None
    from numba import config
    # DLPack's code for the default stream numbagrad's kernels run on: 1 legacy, 2 per-thread.
    per_thread = getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0)
    view = StridedMemoryView(obj, stream_ptr=2 if per_thread else 1)
    if view.readonly:
        raise ValueError(f"{what}: {_name(obj)} is read-only (its DLPack capsule says so); "
                         "numbagrad's kernels need writable memory: copy it with ng.tensor")
    if view.device_id != cuda.get_current_device().id:
        raise ValueError(f"{what}: {_name(obj)} is on CUDA device {view.device_id} but "
                         f"numbagrad runs on device {cuda.get_current_device().id}")
    itemsize = view.dtype.itemsize
    strides = None if view.strides is None else tuple(s * itemsize for s in view.strides)
    desc = {"shape": tuple(view.shape), "strides": strides, "typestr": view.dtype.str,
            "data": (view.ptr, False), "version": 3}
    return cuda.from_cuda_array_interface(desc, owner=view, sync=False)


def cuda_array_interface(array: Any) -> dict:
    """The ``__cuda_array_interface__`` of a Numba device array (simulated ones too)."""
    iface = getattr(array, "__cuda_array_interface__", None)
    if iface is not None:
        return iface
    host = array._ary.__array_interface__        # the simulator's fake device array
    return {"shape": host["shape"], "strides": host["strides"], "typestr": host["typestr"],
            "data": host["data"], "version": 3, "stream": None}


def check_exportable(t: Tensor, what: str) -> None:
    """Refuse to share a tensor that requires grad, as PyTorch does: a write
    through the other library would bypass the tape's saved values."""
    if t.requires_grad:
        raise BufferError(f"{what}: cannot share a tensor that requires grad (a param or a "
                          "recorded op output); use ng.as_tensor(t.data) for its memory "
                          "outside the graph")


def _name(obj: Any) -> str:
    """``obj``'s type as its package names it: torch.Tensor, not Tensor."""
    kind = type(obj)
    return f"{kind.__module__.partition('.')[0]}.{kind.__qualname__}"


def _simulated() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)


class _HostInterface:
    """A CUDA Array Interface read as NumPy's (the simulator's memory is the host's)."""

    def __init__(self, owner: Any, iface: dict) -> None:
        self.owner = owner         # keeps the producer's memory alive
        self.__array_interface__ = {key: iface.get(key) for key in
                                    ("shape", "typestr", "data", "strides")}
        self.__array_interface__["version"] = 3


def _simulated_view(obj: Any, iface: dict) -> Any:
    from numba import cuda
    return cuda.devicearray.FakeCUDAArray(np.asarray(_HostInterface(obj, iface)))
