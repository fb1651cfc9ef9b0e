"""``python -m cxlkv.integrations.check``: is an installed engine one the adapters fit?

For each engine (SGLang, vLLM) it reports, where the engine is importable:

1. which adapter generation it gets and why: for vLLM, the facts of the installed
   ``SecondaryTierManager`` (abstract methods, what ``lookup`` is declared to answer, the job
   dataclass and its id field) that matched a generation, read by the same code the adapter
   uses (:func:`cxlkv.integrations.vllm_generations.identify`); the version only breaks ties
   between generations of one shape. A shape no generation has fails the check, naming the
   engine, its version and what did not match each generation;
2. its version against the adapter's pin (:data:`cxlkv.integrations.TARGETS`): for vLLM a
   note, not a failure, where the shape picked the generation (the adapter runs by it);
3. the interface: the base class imports, the adapter implements every abstract method, and
   each method the adapter overrides has the base class's parameters;
4. a round trip through the adapter itself on a temporary domain and pool in ``/dev/shm``
   (an owner thread in this process): pages/blocks stored from one buffer, found, loaded into
   another, compared byte for byte.

Exit status: 0 when every installed engine passes, 1 when one fails (its first problem is
also written to stderr), 77 when none is installed (nothing to check). ``--json`` prints the
findings as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import TARGETS, parse_version, version_supported
from .vllm_generations import SUPPORTED

Finding = Dict[str, Any]


def _params(fn: Any) -> List[str]:
    try:
        return [p for p in inspect.signature(fn).parameters if p != "self"]
    except (TypeError, ValueError):
        return []


def _interface(base: type, adapter: Optional[type]) -> List[str]:
    """Problems with how `adapter` fits `base` (empty: it fits)."""
    if adapter is None:
        return ["the adapter class was not defined"]
    problems: List[str] = []
    missing = sorted(getattr(adapter, "__abstractmethods__", ()))
    if missing:
        problems.append(f"abstract methods not implemented: {', '.join(missing)}")
    for name, ours in vars(adapter).items():
        if name.startswith("_") or not callable(ours):
            continue
        theirs = getattr(base, name, None)
        if theirs is None:
            continue
        pb, po = _params(theirs), _params(ours)
        if pb and po and pb != po and not any(p.startswith("*") for p in po):
            problems.append(f"{name}{tuple(pb)} in {base.__name__}, {name}{tuple(po)} in the "
                            "adapter")
    for name in getattr(base, "__abstractmethods__", ()):
        if name not in vars(adapter) and not any(name in vars(c) for c in adapter.__mro__[:-1]
                                                 if c is not base):
            problems.append(f"{base.__name__}.{name} is abstract and not overridden")
    return problems


class _TempDomain:
    """A domain and a pool in /dev/shm with an owner thread, removed afterwards."""

    def __init__(self, block_bytes: int) -> None:
        from .. import Arena, Domain, Geometry, Owner, Pool
        from ..pool import layout_for_block_bytes

        tag = f"cxlkv-check-{os.getpid()}-{int(time.time() * 1e6)}"
        self.paths = [f"/dev/shm/{tag}-domain", f"/dev/shm/{tag}-pool"]
        g = Geometry()
        size = (g.bytes_needed() + 4095) // 4096 * 4096
        self.domain_spec = f"file:{self.paths[0]}?size={size}"
        self.pool_spec = f"file:{self.paths[1]}?size={max(64 << 20, block_bytes * 64)}"
        Domain.format(self.domain_spec, g)
        self.owner = Owner.open(self.domain_spec).start(0.002)
        lay, _ = layout_for_block_bytes(block_bytes)
        with Pool.open(self.pool_spec) as p:
            Arena.create(p, lay).close()
        self.pool_spec = f"file:{self.paths[1]}"

    def close(self) -> None:
        self.owner.close()
        for p in self.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def _wait(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def _finished_by(poll_fn: Callable[[], Any]) -> List[Any]:
    """The first batch of finished jobs a tier's poll method reports (waits up to 5 s)."""
    done: List[Any] = []

    def poll() -> bool:
        done.extend(poll_fn())
        return bool(done)

    _wait(poll)
    return done


def _roundtrip_sglang(mod: Any, hs: Any = None) -> List[str]:
    """A round trip through `mod`'s backend class (`hs`: the module with
    HiCacheStorageConfig; SGLang's hicache_storage.py)."""
    from ..page_store import HostPagePool

    if hs is None:
        from sglang.srt.mem_cache import hicache_storage as hs

    page, tokens, token_bytes = 16, 64, 256
    td = _TempDomain(2 * page * token_bytes)
    try:
        fields = {f.name: f for f in dataclasses.fields(hs.HiCacheStorageConfig)}
        known = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                     dp_rank=0, dp_size=1, is_mla_model=False, enable_storage_metrics=False,
                     is_page_first_layout=True, model_name="cxlkv-check", extra_config={})
        need = [n for n, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        unknown = [n for n in need if n not in known]
        if unknown:
            return [f"HiCacheStorageConfig has required fields the check does not know: {unknown}"]
        cfg = hs.HiCacheStorageConfig(**{n: v for n, v in known.items() if n in fields})
        kw = dict(domain=td.domain_spec, host_id=0, pool=td.pool_spec, interface_v1=1,
                  allow_untested_version=True)
        backend = mod.CxlkvHiCacheStorage(cfg, kw)
        try:
            rng = np.random.default_rng(1)
            src = rng.integers(0, 256, (2, tokens, token_bytes), dtype=np.uint8)
            dst = np.zeros_like(src)
            backend.register_mem_pool_host(HostPagePool(src, page, kv_parts=2))
            keys = [bytes([i]) * 32 for i in range(tokens // page)]
            hexkeys = [k.hex() for k in keys]
            idx = np.arange(tokens, dtype=np.int64)
            if not all(backend.batch_set_v1(hexkeys, idx)):
                return ["batch_set_v1 did not store every page"]
            if not _wait(lambda: backend.batch_exists(hexkeys) == len(keys)):
                return [f"batch_exists found {backend.batch_exists(hexkeys)} of {len(keys)} pages"]
            backend.register_mem_pool_host(HostPagePool(dst, page, kv_parts=2))
            if not all(backend.batch_get_v1(hexkeys, idx)):
                return ["batch_get_v1 did not read every page"]
            if not np.array_equal(src, dst):
                return ["pages read back differ from the pages stored"]
            return []
        finally:
            backend.close()
    finally:
        td.close()


class _SpecForCheck:
    """What the check hands the tier as offloading_spec: the tier reads only
    ``vllm_config`` (None here: the model name comes from the tier config's ``model``)."""

    vllm_config = None


def _roundtrip_vllm(mod: Any, base: Any = None) -> List[str]:
    """A round trip through `mod`'s tier class (`base`: the module with the generation's job
    dataclass; vLLM's tiering/base.py)."""
    if base is None:
        from vllm.v1.kv_offload.tiering import base

    gen = mod.GENERATION
    if gen is None or mod.CxlkvSecondaryTier is None:
        return [f"no tier class for this vLLM: {mod.IMPORT_ERROR}"]
    job_cls = getattr(base, gen.job_class, None)
    if job_cls is None:
        return [f"vllm.v1.kv_offload.tiering.base has no {gen.job_class} (the {gen.name} "
                "interface's job type)"]
    rows, row_bytes = 8, 4096
    td = _TempDomain(row_bytes)
    try:
        primary = np.frombuffer(bytearray(os.urandom(row_bytes * rows)), np.uint8).reshape(
            rows, row_bytes)
        # Constructed as the factory does: keywords, then the tier's config dict.
        tier = mod.CxlkvSecondaryTier(offloading_spec=_SpecForCheck(),
                                      primary_kv_view=memoryview(primary),
                                      tier_type=mod.TIER_TYPE, domain=td.domain_spec, host_id=0,
                                      pool=td.pool_spec, model="cxlkv-check",
                                      allow_untested_version=True)
        finished = getattr(tier, gen.finished_method)
        try:
            keys = [bytes([i]) * 32 + (0).to_bytes(4, "big") for i in range(4)]
            fields = {f.name for f in dataclasses.fields(job_cls)}
            args = {"job_id": 1, "keys": keys, gen.job_ids_field: np.arange(4),
                    "is_promotion": False, "req_context": None}
            tier.submit_store(job_cls(**{k: v for k, v in args.items() if k in fields}))
            done = _finished_by(finished)
            if not done or not done[0].success:
                return [f"the store job did not succeed: {done}"]

            def found() -> bool:
                answers = [tier.lookup(k, None) for k in keys]
                return all(a is True or getattr(a, "name", "") == "HIT" for a in answers)

            if not _wait(found):
                return ["lookup does not find the stored blocks"]
            args.update(job_id=2, is_promotion=True)
            args[gen.job_ids_field] = np.arange(4, 8)
            tier.submit_load(job_cls(**{k: v for k, v in args.items() if k in fields}))
            done = _finished_by(finished)
            if not done or not done[0].success:
                return [f"the load job did not succeed: {done}"]
            if not np.array_equal(primary[:4], primary[4:]):
                return ["blocks loaded differ from the blocks stored"]
            return []
        finally:
            tier.shutdown()
    finally:
        td.close()


ENGINES: Dict[str, Tuple[str, str, str, Callable[[Any], List[str]]]] = {
    # engine: (adapter module, base class path, adapter class, round trip)
    "sglang": ("cxlkv.integrations.sglang", "sglang.srt.mem_cache.hicache_storage.HiCacheStorage",
               "CxlkvHiCacheStorage", _roundtrip_sglang),
    "vllm": ("cxlkv.integrations.vllm", "vllm.v1.kv_offload.tiering.base.SecondaryTierManager",
             "CxlkvSecondaryTier", _roundtrip_vllm),
}


def _vllm_generation(f: Finding, mod: Any) -> bool:
    """Records which generation the vLLM adapter uses and why (the adapter's own reading of
    the installed base class, :data:`cxlkv.integrations.vllm.IDENTIFICATION`); False when the
    shape is one no generation has (a problem is recorded, naming what did not match)."""
    ident = getattr(mod, "IDENTIFICATION", None)
    if ident is None:
        f["problems"].append(f"the adapter could not read vLLM's SecondaryTierManager: "
                             f"{mod.IMPORT_ERROR}")
        return False
    f["shape"] = list(ident.shape.facts())
    f["why"] = list(ident.reasons())
    if ident.generation is None:
        f["generation"] = None
        f["problems"].append(
            f"vllm {f['version'] or '(version unknown)'}: its SecondaryTierManager has a shape "
            "no cxlkv adapter generation knows (" + "; ".join(ident.shape.facts()) + ")")
        f["problems"] += list(ident.unmatched())
        fallback = getattr(mod, "GENERATION", None)
        if fallback is not None:
            # What the adapter builds all the same (vllm._from_installed_vllm): the class its
            # version is pinned to, which does not fit this base.
            f["fallback_generation"] = fallback.name
            f["notes"].append(f"the adapter falls back to the {fallback.name} interface its "
                              "version is pinned to, which does not fit this base")
        f["problems"].append("fix: install vllm" + SUPPORTED + ", or report this shape and "
                             "the vLLM version to cxlkv (a new generation in "
                             "cxlkv/integrations/vllm_generations.py)")
        return False
    f["generation"] = ident.generation.name
    f["generation_pin"] = ident.generation.pin
    return True


def _sglang_generation(f: Finding, mod: Any) -> None:
    """SGLang has one adapter class; which transfer path its controller gives a dynamic
    backend is SGLang's choice by release (cxlkv.integrations.sglang.transfer_path)."""
    from .sglang import ZERO_COPY_DYNAMIC_FROM

    f["generation"] = "HiCacheStorage (one adapter class for every supported release)"
    v = parse_version(f["version"] or "")
    zero_copy = bool(v) and v >= parse_version(ZERO_COPY_DYNAMIC_FROM)
    f["why"] = [f"SGLang {ZERO_COPY_DYNAMIC_FROM}+ gives a dynamic backend the zero-copy "
                "batch_*_v1 path when extra_config sets interface_v1; earlier releases the "
                "generic copy path",
                f"version {f['version']}: " + ("zero-copy with interface_v1" if zero_copy
                                               else "the generic copy path")]
    base = getattr(getattr(mod, "CxlkvHiCacheStorage", None), "__mro__", ())[1:2]
    if base and hasattr(base[0], "batch_get_v2"):
        f["why"].append("the base class has the v2 pool interface (SGLang 0.5.10+): a hybrid "
                        "model's other pools (mamba, SWA, indexer) go through batch_*_v2, each "
                        "in a namespace of its own")
    else:
        f["why"].append("the base class has no v2 pool interface (before SGLang 0.5.10): only "
                        "the KV pool is stored")


def check_engine(engine: str) -> Finding:
    """The findings for one engine: ``status`` is "not installed", "ok" or "failed";
    ``generation`` and ``why`` say which adapter generation the installed engine gets and
    why (for vLLM: the facts of its base class that matched)."""
    target = TARGETS[engine]
    f: Finding = {"engine": engine, "pinned": f">={target.min_version},<{target.below_version}",
                  "interface": target.interface, "source": target.source, "problems": [],
                  "notes": []}
    try:
        eng = importlib.import_module(engine)
    except ImportError as e:
        f.update(status="not installed", reason=str(e))
        return f
    f["version"] = getattr(eng, "__version__", None)
    mod_name, base_path, cls_name, roundtrip = ENGINES[engine]
    mod = importlib.import_module(mod_name)
    known_shape = True
    if engine == "vllm":
        known_shape = _vllm_generation(f, mod)
    else:
        _sglang_generation(f, mod)
    outside = not f["version"] or not version_supported(engine, f["version"])
    if outside and engine == "vllm" and known_shape:
        # The adapter runs by the base class's shape whatever the version (vllm.py).
        f["notes"].append(f"version {f['version']} is outside the pin {f['pinned']}; the "
                          "adapter runs by the base class's shape")
    elif outside:
        f["problems"].append(f"version {f['version']} is outside the pin {f['pinned']}")
    try:
        bmod, bname = base_path.rsplit(".", 1)
        base = getattr(importlib.import_module(bmod), bname)
    except (ImportError, AttributeError) as e:
        f["problems"].append(f"{base_path} cannot be imported: {e}")
        f["status"] = "failed"
        return f
    if known_shape:
        f["problems"] += _interface(base, getattr(mod, cls_name))
        if not any("abstract" in p or "not defined" in p for p in f["problems"]):
            try:
                f["problems"] += roundtrip(mod)
            except Exception as e:  # report, do not crash the check
                f["problems"].append(f"round trip failed: {type(e).__name__}: {e}")
    f["status"] = "failed" if f["problems"] else "ok"
    return f


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cxlkv.integrations.check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    ap.add_argument("engines", nargs="*", default=sorted(ENGINES), help="engines to check")
    args = ap.parse_args(argv)
    for e in args.engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r}; known: {', '.join(sorted(ENGINES))}")
    findings = [check_engine(e) for e in args.engines]
    if args.json:
        print(json.dumps(findings, indent=2))
    else:
        for f in findings:
            status = "FAILED" if f["status"] == "failed" else f["status"]
            head = f"{f['engine']}: {status}"
            if f.get("version"):
                head += f" (version {f['version']}, adapter pinned to {f['pinned']})"
            print(head)
            if f["status"] == "not installed":
                print(f"  skipped: {f['reason']}")
            if "generation" in f:
                gen = f["generation"] or "none (unknown shape)"
                if f.get("fallback_generation"):
                    gen += f"; falls back to {f['fallback_generation']} by version"
                print(f"  generation: {gen}")
            for w in f.get("why", []):
                print(f"    because: {w}")
            for n in f.get("notes", []):
                print(f"  note: {n}")
            for p in f["problems"]:
                print(f"  problem: {p}")
    for f in findings:  # loud also under --json: stdout may go to a file
        if f["status"] == "failed":
            first = f["problems"][0]
            if not first.startswith(f["engine"]):
                first = f"{f['engine']} {f.get('version') or '(version unknown)'}: {first}"
            print(f"cxlkv.integrations.check: FAILED: {first}", file=sys.stderr)
    if any(f["status"] == "failed" for f in findings):
        return 1
    if all(f["status"] == "not installed" for f in findings):
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
