"""The few CUDA driver calls the IPC transport needs, through `cuda-bindings` (imported lazily).

torch exposes CUDA IPC only through its multiprocessing reductions (reference-counted, per
tensor) and no stream memory operations, so the transport talks to the driver directly:
memory it allocates and shares itself (`cuMemAlloc` + `cuIpcGetMemHandle`, opened by the peers
once per ring), and 32-bit flag words written and waited for by streams
(`cuStreamWriteValue32` / `cuStreamWaitValue32`): the front end of the GPU waits, no SM spins,
and both operations can be captured into CUDA graphs.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import torch

__all__ = [
    "DeviceMemory",
    "IpcUnavailable",
    "available",
    "close_peer",
    "driver",
    "memcpy",
    "open_peer",
    "tensor_at",
    "wait_value",
    "write_value",
]


class IpcUnavailable(RuntimeError):
    """The IPC transport cannot run here (no cuda-bindings, no CUDA, no stream memory ops)."""


_TLS = threading.local()


@functools.cache  # the module, once found (a failed import is tried again)
def driver():
    """The `cuda.bindings.driver` module, or IpcUnavailable with the fix."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:
        raise IpcUnavailable(
            "The ipc transport (TOKENRING_XDIT_TRANSPORT=ipc) needs the `cuda-bindings` "
            f"package (pip install cuda-bindings matching your CUDA major version): {exc}"
        ) from exc
    return cu


def available() -> bool:
    try:
        driver()
    except IpcUnavailable:
        return False
    return torch.cuda.is_available()


def _check(result, what: str):
    """cuda-bindings returns (CUresult, *values): raise on an error, return the values."""
    cu = driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise RuntimeError(f"{what} failed: {name.decode() if name else err}")
    return values[0] if len(values) == 1 else values


def _ensure_context(device: int) -> None:
    """Make `device`'s primary context (torch's) current on this thread: the driver API acts on
    the thread's current context, and autograd runs the backward on its own threads."""
    done = getattr(_TLS, "ready", None)
    if done is None:
        done = _TLS.ready = set()
    if device in done:
        return
    cu = driver()
    torch.cuda.init()
    with torch.cuda.device(device):
        torch.cuda.current_stream(device)  # creates the primary context if needed
        ctx = _check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(ctx) == 0:
            dev = _check(cu.cuDeviceGet(device), "cuDeviceGet")
            ctx = _check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    done.add(device)


@dataclass
class DeviceMemory:
    """A cuMemAlloc'd range owned by this process, shareable by IPC handle."""

    ptr: int
    nbytes: int
    device: int

    @classmethod
    def alloc(cls, nbytes: int, device: int, zero: bool = True) -> DeviceMemory:
        cu = driver()
        with torch.cuda.device(device):
            _ensure_context(device)
            ptr = int(_check(cu.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))
            if zero:
                _check(cu.cuMemsetD8(ptr, 0, nbytes), "cuMemsetD8")
        return cls(ptr, nbytes, device)

    def handle(self) -> bytes:
        cu = driver()
        with torch.cuda.device(self.device):
            _ensure_context(self.device)
            h = _check(cu.cuIpcGetMemHandle(self.ptr), "cuIpcGetMemHandle")
        return bytes(h.reserved)

    def free(self) -> None:
        if self.ptr:
            cu = driver()
            with torch.cuda.device(self.device):
                _ensure_context(self.device)
                cu.cuMemFree(self.ptr)  # at teardown: an error here changes nothing
            self.ptr = 0


def open_peer(handle: bytes, device: int) -> int:
    """Map a peer's memory (its handle) into this process; the pointer is usable on `device`
    (same GPU, or a peer GPU that can access it)."""
    cu = driver()
    h = cu.CUipcMemHandle()
    h.reserved = handle
    with torch.cuda.device(device):
        _ensure_context(device)
        flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        return int(_check(cu.cuIpcOpenMemHandle(h, flags), "cuIpcOpenMemHandle"))


def close_peer(ptr: int, device: int) -> None:
    cu = driver()
    with torch.cuda.device(device):
        _ensure_context(device)
        cu.cuIpcCloseMemHandle(ptr)


class _Interface:
    """__cuda_array_interface__ of a raw byte range, so torch can view it without copying."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def tensor_at(ptr: int, nbytes: int, device: int) -> torch.Tensor:
    """A uint8 tensor over [ptr, ptr + nbytes) on `device` (it does not own the memory)."""
    with torch.cuda.device(device):
        return torch.as_tensor(_Interface(ptr, nbytes), device=f"cuda:{device}")


def write_value(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    """Enqueue `*addr = value` on `stream`, after everything before it (memory fence)."""
    cu = driver()
    flags = cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
    _value_op(cu, cu.cuStreamWriteValue32, stream, addr, value, flags)


def wait_value(stream: torch.cuda.Stream, addr: int, value: int) -> None:
    """Enqueue on `stream`: nothing after this runs before `*addr == value`."""
    cu = driver()
    flags = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ
    _value_op(cu, cu.cuStreamWaitValue32, stream, addr, value, flags)


def _value_op(cu, op, stream: torch.cuda.Stream, addr: int, value: int, flags) -> None:
    """One stream memory operation on a 32-bit word (op: cuStreamWriteValue32 / WaitValue32)."""
    _ensure_context(stream.device.index)
    _check(op(cu.CUstream(stream.cuda_stream), addr, value, flags), op.__name__)


def memcpy(stream: torch.cuda.Stream, dst: int, src: int, nbytes: int) -> None:
    """Enqueue a copy of `nbytes` on `stream` (unified addresses: same GPU, or a peer GPU's
    memory opened by IPC): a plain cuMemcpyAsync, no kernel of ours (between GPUs the copy
    engines move it; within one GPU the driver chooses)."""
    if nbytes:
        cu = driver()
        _ensure_context(stream.device.index)
        _check(cu.cuMemcpyAsync(dst, src, nbytes, cu.CUstream(stream.cuda_stream)), "cuMemcpyAsync")
