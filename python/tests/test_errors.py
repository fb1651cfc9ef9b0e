"""Every CXLKV_E_* code has an exception class; messages name object, operation and fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cxlkv import _lib, errors
from conftest import HERE

HEADER = HERE.parent.parent / "include" / "cxlkv" / "cxlkv.h"


def test_every_code_of_the_header_has_a_class_and_a_hint() -> None:
    if not HEADER.is_file():
        pytest.skip(f"{HEADER} not found (an installed package without the source tree)")
    codes = {name: int(v) for name, v in
             re.findall(r"(CXLKV_E_[A-Z_]+)\s*=\s*(-\d+)", HEADER.read_text())}
    assert len(codes) >= 17
    # No code of the header is missing from the package, and the package has no stale one.
    assert set(codes.values()) == set(errors.CODE_NAMES)
    for name, code in codes.items():
        assert errors.CODE_NAMES[code] == name
        cls = errors.error_class(code)
        assert cls is not errors.CxlkvError and cls.code == code, name
        assert errors.DEFAULT_HINTS[code], name
        e = errors.from_code(code, "detail", operation="op", subject="Thing(x)")
        assert isinstance(e, cls)
        s = str(e)
        assert s.startswith("Thing(x): op: detail") and f"[{name}]" in s and " — " in s


def test_library_names_match_the_package_names() -> None:
    lib = _lib.load()
    for code, name in errors.CODE_NAMES.items():
        assert lib.strerror(code), name


def test_builtin_bases() -> None:
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.NotFoundError, LookupError)
    assert issubclass(errors.PermissionDeniedError, PermissionError)
    assert issubclass(errors.ExistsError, FileExistsError)
    assert issubclass(errors.BufferMismatchError, TypeError)
    assert issubclass(errors.ClosedError, errors.InvalidArgumentError)
    assert issubclass(errors.EngineVersionError, RuntimeError)
    assert issubclass(errors.LibraryNotFoundError, ImportError)
    assert errors.error_class(errors.E_BUSY) is errors.BusyError
    assert "pinned" in errors.DEFAULT_HINTS[errors.E_BUSY]
    e = errors.from_code(-99, "what")
    assert type(e) is errors.CxlkvError and "code -99" in str(e)


def test_library_not_found_names_what_was_tried(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setattr(_lib, "_LIB", None)
    monkeypatch.setenv("CXLKV_LIBRARY", str(tmp_path / "libcxlkv.so.0"))
    with pytest.raises(errors.LibraryNotFoundError, match="CXLKV_LIBRARY=") as e:
        _lib.load()
    assert "unset it" in str(e.value)
