"""The ctypes structs have the C compiler's sizes and field offsets (cxlkv.h)."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cxlkv import _lib
from conftest import HERE

INCLUDE = HERE.parent.parent / "include"


def test_struct_layouts_match_the_header(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (apt-get install build-essential)")
    if not (INCLUDE / "cxlkv" / "cxlkv.h").is_file():
        pytest.skip("include/cxlkv/cxlkv.h not found (an installed package without the tree)")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "cxlkv/cxlkv.h"',
             "int main(void) {", 'printf("{");']
    first = True
    for cname, py in _lib.STRUCTS.items():
        for fname, *_ in py._fields_:
            sep = "" if first else ","
            first = False
            lines.append(f'printf("{sep}\\"{cname}.{fname}\\": %zu", offsetof({cname}, {fname}));')
        lines.append(f'printf(",\\"{cname}\\": %zu", sizeof({cname}));')
    lines += ['printf("}");', "return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", f"-I{INCLUDE}", str(src), "-o", str(exe)], check=True)
    c = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    for cname, py in _lib.STRUCTS.items():
        assert ctypes.sizeof(py) == c[cname], cname
        for fname, *_ in py._fields_:
            assert getattr(py, fname).offset == c[f"{cname}.{fname}"], f"{cname}.{fname}"
