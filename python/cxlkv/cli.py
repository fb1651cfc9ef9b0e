"""``python -m cxlkv``: the package's command line.

``python -m cxlkv status [--pool SPEC ...] [--domain SPEC ...] [--tier DIR ...] [--json]``
reports

* the library: version (from its file name), the file loaded and how it was found, the
  package version and location, and whether the GPU half works (built with CUDA, a device);
* each ``--pool``: the arena in it (uuid, region and metadata bytes, processes attached) and
  each size class's block size and blocks free / allocated / published (persisted) / cached
  in per-thread caches. Opening the arena attaches this process briefly (an owner slot);
  ``cxlkvctl arena info`` reads the same without attaching;
* each ``--domain``: the size of its source (for ``file:`` specs) against the bytes a
  default geometry needs. The C API exposes neither a formatted domain's geometry nor its
  occupancy without joining it as a host; for a domain run by an orchestrator,
  ``cxlkvctl status`` / ``prefixes`` show both.

* each ``--tier DIR``: an NVMe tier store a :class:`cxlkv.Tier` left in DIR (it must exist and
  hold ``cxlkv-nvme.meta``: nothing is created). The C API reads a store only through a tier,
  so this opens one briefly over ``--tier-pool`` (default: the one ``--pool``) and its size
  class ``--tier-class`` (default 0), both as the engine used them, and reports its counters
  (``cxlkv_tier_stats``): the blocks on NVMe and the slot file's size (the move counters of a
  tier just opened are zero). A store that a running tier holds (its lock) is reported as in
  use: that process's ``Tier.stats()`` has its live counters.

``--json`` prints one JSON object (the test oracle, as with cxlkvctl). Exit status 0, or 1 if
something asked for could not be read (the report says what).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from typing import Any, Dict, List, Optional

from . import __version__, _lib, errors


def _size(n: Optional[int]) -> str:
    if n is None:
        return "unknown"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _file_of(spec: str) -> Optional[str]:
    if spec.startswith("file:"):
        return spec[len("file:"):].split("?", 1)[0]
    return None


def library_status() -> Dict[str, Any]:
    lib = _lib.load()
    out: Dict[str, Any] = {
        "version": lib.version, "path": lib.path, "realpath": lib.realpath, "found_by": lib.how,
        "package_version": __version__,
        "package_path": os.path.dirname(os.path.abspath(__file__)),
    }
    gpu = ctypes.c_void_p()
    rc = lib.cxlkv_gpu_open(0, ctypes.byref(gpu))
    if rc == 0:
        lib.cxlkv_gpu_close(gpu.value)
        out["gpu"] = "available (device 0)"
    elif rc == errors.E_NO_CUDA:
        out["gpu"] = "not built with CUDA"
    elif rc == errors.E_NO_DEVICE:
        out["gpu"] = f"built with CUDA, no device: {lib.last_error()}"
    else:
        out["gpu"] = f"error: {lib.last_error() or lib.strerror(rc)}"
    return out


def pool_status(spec: str) -> Dict[str, Any]:
    from .pool import Arena, Pool

    out: Dict[str, Any] = {"spec": spec}
    f = _file_of(spec)
    if f and os.path.exists(f):
        out["source_bytes"] = os.path.getsize(f)
    try:
        with Pool.open(spec) as pool:
            with Arena.open(pool) as arena:
                st = arena.stats()
        out.update(arena_uuid=st.arena_uuid, region_bytes=st.region_bytes,
                   metadata_bytes=st.metadata_bytes, owners_active=st.owners_active,
                   classes=[{"class": i, "block_bytes": c.block_bytes,
                             "total_blocks": c.total_blocks, "free_blocks": c.free_blocks,
                             "allocated_blocks": c.allocated_blocks,
                             "persisted_blocks": c.persisted_blocks,
                             "cached_blocks": c.cached_blocks}
                            for i, c in enumerate(st.classes)])
    except errors.CxlkvError as e:
        out["error"] = str(e)
    return out


def domain_status(spec: str) -> Dict[str, Any]:
    from .domain import Geometry

    out: Dict[str, Any] = {"spec": spec, "default_geometry_bytes": Geometry().bytes_needed()}
    f = _file_of(spec)
    if spec.startswith("orchestrator:"):
        out["note"] = "run by an orchestrator: `cxlkvctl status` shows its geometry and use"
    elif f is not None:
        if os.path.exists(f):
            out["source_bytes"] = os.path.getsize(f)
        else:
            out["error"] = f"{f} does not exist (format it: cxlkv.Domain.format(spec))"
    out["geometry"] = ("not exposed by the C API for a formatted domain (no query call); "
                       "the owner role and cxlkvctl read it")
    return out


def tier_status(directory: str, pool_spec: Optional[str], size_class: int) -> Dict[str, Any]:
    from .pool import Arena, Pool
    from .tier import Tier, TierOptions

    out: Dict[str, Any] = {"dir": directory, "pool": pool_spec, "size_class": size_class}
    meta = os.path.join(directory, "cxlkv-nvme.meta")
    if not os.path.isfile(meta):
        out["error"] = (f"{directory} is not an NVMe tier store (no cxlkv-nvme.meta): pass the "
                        "nvme_dir a tier was opened with")
        return out
    slots = os.path.join(directory, "cxlkv-nvme.slots")
    if os.path.exists(slots):
        out["slot_file_bytes"] = os.path.getsize(slots)
    if pool_spec is None:
        out["error"] = ("the C API reads a store only through a tier over an arena: pass "
                        "--tier-pool SPEC (the pool the engine's tier used), or one --pool")
        return out
    try:
        with Pool.open(pool_spec) as pool:
            with Arena.open(pool) as arena:
                with Tier.open(arena, TierOptions(nvme_dir=directory,
                                                  size_class=size_class)) as tier:
                    out["stats"] = tier.stats().to_dict()
    except errors.MismatchError as e:
        if "another process" in e.detail or "in use" in e.detail:
            out["in_use"] = str(e)
        else:
            out["error"] = str(e)
    except errors.CxlkvError as e:
        out["error"] = str(e)
    return out


def _print_text(rep: Dict[str, Any]) -> None:
    lib = rep["library"]
    print(f"library   libcxlkv {lib['version']}  {lib['realpath']}  (found: {lib['found_by']})")
    print(f"package   cxlkv {lib['package_version']}  {lib['package_path']}")
    print(f"gpu       {lib['gpu']}")
    for p in rep["pools"]:
        print(f"pool      {p['spec']}")
        if "source_bytes" in p:
            print(f"  source    {_size(p['source_bytes'])}")
        if "error" in p:
            print(f"  error     {p['error']}")
            continue
        print(f"  arena     {p['arena_uuid']}: region {_size(p['region_bytes'])}, metadata "
              f"{_size(p['metadata_bytes'])}, {p['owners_active']} process(es) attached")
        for c in p["classes"]:
            print(f"  class {c['class']}   blocks of {_size(c['block_bytes'])}: "
                  f"{c['total_blocks']} "
                  f"total, {c['free_blocks']} free, {c['allocated_blocks']} allocated, "
                  f"{c['persisted_blocks']} published/persisted, {c['cached_blocks']} cached")
    for d in rep["domains"]:
        print(f"domain    {d['spec']}")
        if "source_bytes" in d:
            print(f"  source    {_size(d['source_bytes'])}; a default geometry needs "
                  f"{_size(d['default_geometry_bytes'])}")
        for k in ("error", "note"):
            if k in d:
                print(f"  {k:<9} {d[k]}")
        print(f"  geometry  {d['geometry']}")
    for t in rep.get("tiers", []):
        print(f"tier      {t['dir']}  (class {t['size_class']} of {t['pool']})")
        if "slot_file_bytes" in t:
            print(f"  slots     {_size(t['slot_file_bytes'])}")
        for k in ("error", "in_use"):
            if k in t:
                print(f"  {k:<9} {t[k]}")
        st = t.get("stats")
        if st:
            print(f"  nvme      {st['nvme_blocks']} block(s) of {_size(st['block_bytes'])}, "
                  f"slot file {_size(st['nvme_file_bytes'])}, {st['nvme_data_loss']} lost")
            print(f"  cxl       capacity {st['cxl_capacity_blocks']} block(s), watermarks "
                  f"{st['high_watermark_blocks']} / {st['low_watermark_blocks']}, "
                  f"break-even reuse interval {st['break_even_s']:.3g} s")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cxlkv", description="cxlkv from Python")
    ap.add_argument("--version", action="version", version=f"cxlkv {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status", help="the library, pools and domains",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("--pool", action="append", default=[], metavar="SPEC",
                    help="a pool spec to report (repeatable)")
    st.add_argument("--domain", action="append", default=[], metavar="SPEC",
                    help="a domain spec to report (repeatable)")
    st.add_argument("--tier", action="append", default=[], metavar="DIR",
                    help="an NVMe tier store directory to report (repeatable)")
    st.add_argument("--tier-pool", metavar="SPEC", default=None,
                    help="the pool whose arena the tier was opened over (default: the --pool, "
                    "when there is one)")
    st.add_argument("--tier-class", metavar="N", type=int, default=0,
                    help="the arena size class of the tier (default 0)")
    st.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    try:
        rep: Dict[str, Any] = {"library": library_status()}
    except errors.LibraryNotFoundError as e:
        if args.json:
            print(json.dumps({"library": {"error": str(e)}}, indent=2))
        else:
            print(f"library   {e}", file=sys.stderr)
        return 1
    rep["pools"] = [pool_status(s) for s in args.pool]
    rep["domains"] = [domain_status(s) for s in args.domain]
    tier_pool = args.tier_pool or (args.pool[0] if len(args.pool) == 1 else None)
    rep["tiers"] = [tier_status(d, tier_pool, args.tier_class) for d in args.tier]
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        _print_text(rep)
    return 1 if any("error" in x for x in rep["pools"] + rep["domains"] + rep["tiers"]) else 0
