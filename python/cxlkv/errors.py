"""Exceptions raised by the cxlkv package.

Every ``CXLKV_E_*`` code of the C API (``include/cxlkv/cxlkv.h``) has its own class, all
derived from :class:`CxlkvError`. Each also derives from the built-in exception a Python
caller would expect (``ValueError`` for a bad argument, ``PermissionError``, ``LookupError``
...), so ``except ValueError`` keeps working.

A message names the object (the pool spec, the domain and host id, the key, the tensor), the
operation, what the library said (``cxlkv_last_error()``, which names the object on the C
side) and what to do about it. The same parts are attributes: ``code``, ``code_name``,
``operation``, ``subject``, ``detail`` and ``hint``.

Errors detected in Python before anything reaches the library (a key of the wrong length, a
tensor of the wrong dtype, a closed handle) use the same classes, with ``code`` set to the
C code that describes them (``CXLKV_E_INVALID`` for most), so nothing is half done when one
is raised.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

# The C API's codes (cxlkv.h). Kept here, not read from the library, so the package can
# report a library that fails to load.
OK = 0
E_INVALID = -1
E_NOT_FOUND = -2
E_PERMISSION = -3
E_EXISTS = -4
E_CORRUPT = -5
E_MISMATCH = -6
E_FULL = -7
E_DOUBLE_FREE = -8
E_STALE = -9
E_FOREIGN = -10
E_INTERNAL = -11
E_NO_CUDA = -12
E_NO_DEVICE = -13
E_PENDING = -14
E_CUDA = -15
E_REVOKED = -16
E_BUSY = -17

# "CXLKV_E_FULL" for E_FULL, ...: the names of the constants above, as the header spells them.
CODE_NAMES: Dict[int, str] = {
    value: "CXLKV_" + name for name, value in list(globals().items()) if name.startswith("E_")
}

# What to do, per code, when the library's own message does not say. Appended to every
# message so a caller never has to look a code up.
DEFAULT_HINTS: Dict[int, str] = {
    E_INVALID: "check the argument named above against the function's contract",
    E_NOT_FOUND: "check the spec or path; format the arena or domain, or publish the block, first",
    E_PERMISSION: "run as a user allowed to open and map the source (e.g. a member of its group), "
    "or fix its permissions",
    E_EXISTS: "open the existing arena (Arena.open), or format with force=True to overwrite it",
    E_CORRUPT: "nothing was modified; run `cxlkvctl arena recover <spec>` or format the "
    "source again",
    E_MISMATCH: "open it with the layout and version it was formatted with, and make sure no "
    "other process uses or formats it (for a domain: this host was fenced and rejoined)",
    E_FULL: "free blocks or release leases, heartbeat and retry, or format a larger pool/domain",
    E_DOUBLE_FREE: "free each block exactly once",
    E_STALE: "discard what was read and look the prefix up again",
    E_FOREIGN: "pass the arena that holds this block (the publisher's pool opened with Arena.open)",
    E_INTERNAL: "an operating-system call failed; the message names it",
    E_NO_CUDA: "use a libcxlkv built with the CUDA toolkit (-DCXLKV_WITH_CUDA=ON)",
    E_NO_DEVICE: "run on a machine with a CUDA device and driver",
    E_PENDING: "not finished yet: poll again later",
    E_CUDA: "the CUDA driver refused; the message names the call",
    E_REVOKED: "the arena's extent was revoked: close the arena and grow a new one",
    E_BUSY: "not now: the block is pinned (release it), its NVMe I/O is in flight (wait for "
    "the prefetch or read, then retry) or it is cooling down after a demotion (retry after "
    "placement.cooldown_ms, or read it from NVMe with Tier.read)",
}


# The class of each code: filled in by the classes' definitions below (CxlkvError's
# __init_subclass__).
_BY_CODE: Dict[int, Type["CxlkvError"]] = {}


class CxlkvError(Exception):
    """Base class of every error the package raises.

    Attributes:
        code: the ``CXLKV_E_*`` value (negative int).
        code_name: its name, e.g. ``"CXLKV_E_FULL"``.
        operation: what was being done, e.g. ``"cxlkv_lease_copy_out"`` or ``"batch_set_v1"``.
        subject: the object it was done to, e.g. ``"Domain(file:/dev/shm/d, host 1)"``.
        detail: the library's message (``cxlkv_last_error()``) or the Python-side check's.
        hint: what to do about it.
        results: for a key of a tier call (``cxlkv.tier``), the per-key outcomes of the whole
            call (a ``TierResults``): which keys succeeded, which failed; else None.
    """

    code: int = E_INTERNAL
    results: Optional[Any] = None

    def __init_subclass__(cls, code: Optional[int] = None, **kwargs: Any) -> None:
        """``class FullError(CxlkvError, code=E_FULL)``: the class of that code.

        error_class() and from_code() return it for the code. A subclass that only sets the
        ``code`` attribute (an error found in Python) describes itself by that code without
        becoming the code's class.
        """
        super().__init_subclass__(**kwargs)
        if code is not None:
            if code in _BY_CODE:
                raise TypeError(f"{CODE_NAMES.get(code, code)} already has a class: "
                                f"{_BY_CODE[code].__name__}")
            cls.code = code
            _BY_CODE[code] = cls

    def __init__(
        self,
        detail: str,
        *,
        operation: str = "",
        subject: str = "",
        hint: Optional[str] = None,
        code: Optional[int] = None,
    ) -> None:
        if code is not None:
            self.code = code
        self.code_name = CODE_NAMES.get(self.code, f"code {self.code}")
        self.operation = operation
        self.subject = subject
        self.detail = detail
        self.hint = hint if hint is not None else DEFAULT_HINTS.get(self.code, "")
        super().__init__(self._format())

    def _format(self) -> str:
        where = ": ".join(p for p in (self.subject, self.operation) if p)
        text = f"{where}: {self.detail}" if where else self.detail
        text += f" [{self.code_name}]"
        if self.hint:
            text += f" — {self.hint}"
        return text

    def __str__(self) -> str:
        return self._format()


class InvalidArgumentError(CxlkvError, ValueError, code=E_INVALID):
    """CXLKV_E_INVALID: a bad argument or spec."""


class NotFoundError(CxlkvError, LookupError, code=E_NOT_FOUND):
    """CXLKV_E_NOT_FOUND: no such device, file, node, arena or published block."""


class PermissionDeniedError(CxlkvError, PermissionError, code=E_PERMISSION):
    """CXLKV_E_PERMISSION: the source cannot be opened or mapped by this user."""


class ExistsError(CxlkvError, FileExistsError, code=E_EXISTS):
    """CXLKV_E_EXISTS: an arena is already there."""


class CorruptError(CxlkvError, code=E_CORRUPT):
    """CXLKV_E_CORRUPT: corrupt or torn metadata; nothing was modified."""


class MismatchError(CxlkvError, code=E_MISMATCH):
    """CXLKV_E_MISMATCH: foreign data, another layout or version, in use, or fenced."""


class FullError(CxlkvError, code=E_FULL):
    """CXLKV_E_FULL: no free block of that class, lease row, owner slot or ring slot."""


class DoubleFreeError(CxlkvError, code=E_DOUBLE_FREE):
    """CXLKV_E_DOUBLE_FREE: the block was already freed."""


class StaleError(CxlkvError, code=E_STALE):
    """CXLKV_E_STALE: the lease expired or the block was retired or reused: discard the data."""


class ForeignError(CxlkvError, ValueError, code=E_FOREIGN):
    """CXLKV_E_FOREIGN: not a block (or pointer) of this arena."""


class InternalError(CxlkvError, OSError, code=E_INTERNAL):
    """CXLKV_E_INTERNAL: an unexpected operating-system error."""


class NoCudaError(CxlkvError, code=E_NO_CUDA):
    """CXLKV_E_NO_CUDA: the library was built without CUDA."""


class NoDeviceError(CxlkvError, code=E_NO_DEVICE):
    """CXLKV_E_NO_DEVICE: no CUDA device."""


class PendingError(CxlkvError, code=E_PENDING):
    """CXLKV_E_PENDING: not finished yet."""


class CudaError(CxlkvError, code=E_CUDA):
    """CXLKV_E_CUDA: the CUDA driver refused or failed."""


class RevokedError(CxlkvError, code=E_REVOKED):
    """CXLKV_E_REVOKED: the arena's extent was revoked."""


class BusyError(CxlkvError, code=E_BUSY):
    """CXLKV_E_BUSY: refused for now (pinned, NVMe I/O in flight, or cooling down): retry."""


# ---- errors found in Python before the library is called -----------------------------------


class ClosedError(InvalidArgumentError):
    """A pool, arena, domain, owner, lease set or store was used after it was closed."""


class KeyLengthError(InvalidArgumentError):
    """A key or digest of the wrong length or form (engine digests are 16 or 32 bytes)."""


class BufferMismatchError(InvalidArgumentError, TypeError):
    """A tensor or buffer of the wrong size, dtype, device, contiguity or writability."""


class EngineVersionError(CxlkvError, RuntimeError):
    """A serving engine whose version or interface the adapter was not written for."""

    code = E_MISMATCH


class LibraryNotFoundError(CxlkvError, ImportError):
    """libcxlkv.so could not be found or loaded."""

    code = E_NOT_FOUND


def error_class(code: int) -> Type[CxlkvError]:
    """The exception class for a ``CXLKV_E_*`` code (``CxlkvError`` for an unknown one)."""
    return _BY_CODE.get(code, CxlkvError)


def from_code(
    code: int, detail: str, *, operation: str = "", subject: str = "", hint: Optional[str] = None
) -> CxlkvError:
    """Builds the exception for a code returned by the library."""
    cls = error_class(code)
    if cls is CxlkvError:
        return CxlkvError(detail, operation=operation, subject=subject, hint=hint, code=code)
    return cls(detail, operation=operation, subject=subject, hint=hint)
