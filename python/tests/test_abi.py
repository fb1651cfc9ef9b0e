"""The ctypes structs have the C compiler's sizes and field offsets (cxlkv.h), the package's
constants the header's values, and every function of the bound sections a prototype."""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
from typing import Any, Dict

import pytest

from cxlkv import _lib, errors, tier
from conftest import HERE

INCLUDE = HERE.parent.parent / "include"
HEADER = INCLUDE / "cxlkv" / "cxlkv.h"

# Constants of cxlkv.h and the package's value for each.
CONSTANTS: Dict[str, int] = {
    "CXLKV_MAX_CLASSES": _lib.MAX_CLASSES,
    "CXLKV_FORMAT_FORCE": _lib.FORMAT_FORCE,
    **{f"CXLKV_TIER_{r.name}": int(r) for r in tier.Residence},
    "CXLKV_TIER_CXL_EXPANDED": int(tier.CxlKind.EXPANDED),
    "CXLKV_TIER_CXL_POOLED": int(tier.CxlKind.POOLED),
    "CXLKV_TIER_NVME_DSYNC": tier.NVME_DSYNC,
    "CXLKV_TIER_NVME_STAGE_READS": tier.NVME_STAGE_READS,
    "CXLKV_TIER_NVME_DIRECT_READS": tier.NVME_DIRECT_READS,
    "CXLKV_TIER_RECORD_USE": tier.RECORD_USE,
    "CXLKV_TIER_PREFETCH_FORCE": tier.PREFETCH_FORCE,
    "CXLKV_TIER_EXPLAIN_JSON": tier.EXPLAIN_JSON,
    **{name: code for code, name in errors.CODE_NAMES.items()},
}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """Offsets, sizes and constants as the C compiler sees them."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (apt-get install build-essential)")
    if not HEADER.is_file():
        pytest.skip("include/cxlkv/cxlkv.h not found (an installed package without the tree)")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "cxlkv/cxlkv.h"',
             "int main(void) {", 'printf("{\\"_\\": 0");']
    for cname, py in _lib.STRUCTS.items():
        for fname, *_ in py._fields_:
            lines.append(f'printf(",\\"{cname}.{fname}\\": %zu", offsetof({cname}, {fname}));')
        lines.append(f'printf(",\\"{cname}\\": %zu", sizeof({cname}));')
        lines.append(f'printf(",\\"{cname}/align\\": %zu", _Alignof({cname}));')
    for name in CONSTANTS:
        lines.append(f'printf(",\\"{name}\\": %lld", (long long)({name}));')
    lines += ['printf("}");', "return 0; }"]
    tmp = tmp_path_factory.mktemp("abi")
    src = tmp / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp / "layout"
    subprocess.run([cc, "-std=c11", f"-I{INCLUDE}", str(src), "-o", str(exe)], check=True)
    out: Dict[str, Any] = json.loads(
        subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    return out


def test_struct_layouts_match_the_header(c_layout: Dict[str, Any]) -> None:
    for cname, py in _lib.STRUCTS.items():
        assert ctypes.sizeof(py) == c_layout[cname], cname
        assert ctypes.alignment(py) == c_layout[f"{cname}/align"], cname
        for fname, *_ in py._fields_:
            assert getattr(py, fname).offset == c_layout[f"{cname}.{fname}"], f"{cname}.{fname}"


def test_every_struct_of_the_bound_sections_is_mirrored() -> None:
    if not HEADER.is_file():
        pytest.skip(f"{HEADER} not found (an installed package without the source tree)")
    text = HEADER.read_text()
    declared = set(re.findall(r"typedef struct (cxlkv_\w+) \{", text))
    # The GPU half's structs are not bound (the package only checks whether it works).
    unbound = {s for s in declared if s.startswith("cxlkv_gpu_")}
    assert declared - unbound == set(_lib.STRUCTS), "mirror every struct in cxlkv/_lib.py"


def test_constants_match_the_header(c_layout: Dict[str, Any]) -> None:
    for name, value in CONSTANTS.items():
        assert c_layout[name] == value, name
    text = HEADER.read_text()
    residences = set(re.findall(r"\b(CXLKV_TIER_[A-Z_]+) = \d", text)) - {
        "CXLKV_TIER_CXL_EXPANDED", "CXLKV_TIER_CXL_POOLED"}
    assert residences == {f"CXLKV_TIER_{r.name}" for r in tier.Residence}


def test_every_tier_function_has_a_prototype() -> None:
    if not HEADER.is_file():
        pytest.skip(f"{HEADER} not found (an installed package without the source tree)")
    text = HEADER.read_text()
    declared = set(re.findall(r"\b(cxlkv_tier_\w+)\(", text))
    declared |= {"cxlkv_prefix_key_from_digest"}
    assert len(declared) >= 17
    missing = declared - set(_lib._PROTOTYPES)
    assert not missing, f"bind {sorted(missing)} in cxlkv/_lib.py and cxlkv/tier.py"
    used = (HERE.parent / "cxlkv" / "tier.py").read_text()
    unused = {n for n in declared if n.startswith("cxlkv_tier_") and n not in used}
    assert not unused, f"tier.py wraps no call of {sorted(unused)}"
