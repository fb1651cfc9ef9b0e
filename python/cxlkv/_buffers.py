"""Turning numpy arrays, torch tensors and buffer-protocol objects into (address, size).

A destination (what the library writes into) must be a CPU, C-contiguous, writable buffer; a
source (what it reads) must be CPU and C-contiguous. numpy arrays and torch tensors are
checked through their own attributes (torch is never imported here: a tensor is recognized by
its type's module); anything else goes through the buffer protocol (bytes, bytearray,
memoryview, mmap, array.array).

Every failure is a BufferMismatchError naming the object (its type, dtype, shape) and the fix,
raised before the library is called.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import numpy as np

from .errors import BufferMismatchError


def describe(obj: Any) -> str:
    """A short name for a buffer in messages: type, dtype and shape."""
    if isinstance(obj, np.ndarray):
        return f"numpy.ndarray(dtype={obj.dtype}, shape={tuple(obj.shape)})"
    if _is_tensor(obj):
        return f"torch.Tensor(dtype={obj.dtype}, shape={tuple(obj.shape)}, device={obj.device})"
    try:
        mv = memoryview(obj)
        return f"{type(obj).__name__}(format={mv.format!r}, nbytes={mv.nbytes})"
    except TypeError:
        return type(obj).__name__


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def dtype_matches(obj: Any, dtype: Any) -> bool:
    """Whether obj's element type is `dtype` (a numpy dtype or a torch dtype, either kind)."""
    if isinstance(obj, np.ndarray):
        have = obj.dtype.name
    elif _is_tensor(obj):
        have = _dtype_name(obj.dtype)
    else:
        have = np.dtype(memoryview(obj).format).name
    want = np.dtype(dtype).name if not _is_torch_dtype(dtype) else _dtype_name(dtype)
    aliases = {"half": "float16", "float": "float32", "double": "float64", "bfloat16": "bfloat16"}
    return aliases.get(have, have) == aliases.get(want, want)


def _is_torch_dtype(dtype: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(dtype, torch.dtype)


def address(
    obj: Any,
    *,
    writable: bool,
    what: str,
    nbytes: Optional[int] = None,
    dtype: Any = None,
) -> Tuple[int, int]:
    """(address, size in bytes) of a CPU, C-contiguous buffer.

    Args:
        obj: a numpy array, torch tensor, or buffer-protocol object.
        writable: the library will write into it (a destination).
        what: how messages name it ("destination of copy_out", "page 3 of batch_set").
        nbytes: the exact size required, if any.
        dtype: the element type required, if any (numpy or torch dtype).

    Raises:
        BufferMismatchError: a GPU tensor, a non-contiguous or read-only buffer, a tensor that
            requires grad (as a destination), or the wrong size or dtype.
    """
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise BufferMismatchError(
                f"{describe(obj)} is not C-contiguous",
                operation=what,
                hint="pass numpy.ascontiguousarray(x), or a contiguous slice",
            )
        if writable and not obj.flags.writeable:
            raise BufferMismatchError(
                f"{describe(obj)} is read-only", operation=what,
                hint="pass a writable array (e.g. numpy.empty_like(x))")
        addr, size = int(obj.__array_interface__["data"][0]), int(obj.nbytes)
    elif _is_tensor(obj):
        if not obj.is_cpu:
            raise BufferMismatchError(
                f"{describe(obj)} is not in host memory",
                operation=what,
                hint="copy through a CPU tensor (pinned for speed), or use the GPU half of the "
                "C API (cxlkv_gpu_copy_blocks)",
            )
        if not obj.is_contiguous():
            raise BufferMismatchError(
                f"{describe(obj)} is not contiguous", operation=what,
                hint="pass tensor.contiguous() (and copy back), or a contiguous view")
        if writable and obj.requires_grad:
            raise BufferMismatchError(
                f"{describe(obj)} requires grad; writing into it would bypass autograd",
                operation=what, hint="pass tensor.detach()")
        addr, size = int(obj.data_ptr()), int(obj.numel() * obj.element_size())
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise BufferMismatchError(
                f"{type(obj).__name__} is neither a numpy array, a torch tensor nor a buffer",
                operation=what, hint="pass a numpy array, a CPU torch tensor or a bytearray",
            ) from None
        if not mv.c_contiguous:
            raise BufferMismatchError(f"{describe(obj)} is not C-contiguous", operation=what,
                                      hint="pass a contiguous buffer")
        if writable and mv.readonly:
            raise BufferMismatchError(f"{describe(obj)} is read-only", operation=what,
                                      hint="pass a bytearray or a writable memoryview")
        if mv.nbytes == 0:
            addr, size = 0, 0
        else:
            arr = np.frombuffer(mv.cast("B"), dtype=np.uint8)
            addr, size = int(arr.__array_interface__["data"][0]), int(mv.nbytes)
    if dtype is not None and not dtype_matches(obj, dtype):
        raise BufferMismatchError(
            f"{describe(obj)} has the wrong dtype: expected {_dtype_name(dtype)}",
            operation=what,
            hint=f"pass a buffer of dtype {_dtype_name(dtype)} (or .view() it as one)",
        )
    if nbytes is not None and size != nbytes:
        raise BufferMismatchError(
            f"{describe(obj)} holds {size} bytes, expected exactly {nbytes}",
            operation=what,
            hint=f"pass a buffer of {nbytes} bytes (the page or block size asked for)",
        )
    return addr, size
