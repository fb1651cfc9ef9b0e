"""The demo's two serving processes and the driver that runs them.

* Host A (:func:`publisher`) builds the model, prefills the shared system prompt from an empty
  cache, grows an arena in an extent of the domain's pooled region (through the orchestrator)
  and publishes the prompt's full KV blocks and its manifest (:mod:`cxlkv.demo.share`), then
  stays joined until the driver is done.
* Host B (:func:`server`) builds its model (the same one, unless told otherwise), joins with
  no arena of its own, checks the manifest (a model or layout mismatch is refused), then
  serves every request twice, in alternating order: *cold* (prefill every token from an empty
  cache: what a server without the domain does) and *shared* (chain lookup, leases,
  validated copy-out of the published blocks into the cache, prefill of the rest only). It
  reports per request the time to first token of both, the blocks loaded, the tokens the
  model actually ran (from the model's own counter), the bytes copied, and whether the two
  next-token logits are equal.
* :func:`run` starts both as separate processes (``spawn``: each maps the domain itself, as
  another machine would), collects their reports and returns them; a host's failure is
  raised here (:class:`DemoError`, or :class:`~cxlkv.demo.share.ModelMismatchError`).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .model import KvSpec, ModelConfig

TOKEN_SEED = 7  # the default seed of the prompt and requests


class DemoError(RuntimeError):
    """A host process of the demo failed (the message carries its error)."""


@dataclass(frozen=True)
class HostSpec:
    """What one serving process runs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    kv: KvSpec = field(default_factory=KvSpec)


@dataclass(frozen=True)
class DemoConfig:
    domain: str  # orchestrator:<socket> (or any spec Domain.join takes, with extents to grow)
    tenant: str = "cxlkv-demo"
    prompt_tokens: int = 512
    requests: int = 6
    suffix_tokens: Tuple[int, int] = (16, 64)  # user tokens after the prompt, min..max
    seed: int = TOKEN_SEED
    hosts: Tuple[int, int] = (2, 3)  # A (publisher), B (server)
    a: HostSpec = field(default_factory=HostSpec)
    b: Optional[HostSpec] = None  # None: the same as `a`
    threads: int = 1  # torch threads per process
    timeout_s: float = 120.0
    rtol: float = 1e-5  # the logits check: torch.allclose(shared, cold, rtol, atol)
    atol: float = 1e-5

    @property
    def b_spec(self) -> HostSpec:
        return self.b if self.b is not None else self.a


def workload(cfg: DemoConfig) -> Tuple[List[int], List[List[int]]]:
    """The system prompt and the requests (prompt + user tokens), from `cfg.seed`."""
    vocab = min(cfg.a.model.vocab, cfg.b_spec.model.vocab)
    rng = np.random.default_rng(cfg.seed)
    prompt = [int(t) for t in rng.integers(0, vocab, cfg.prompt_tokens)]
    lo, hi = cfg.suffix_tokens
    requests = [prompt + [int(t) for t in rng.integers(0, vocab, int(rng.integers(lo, hi + 1)))]
                for _ in range(cfg.requests)]
    return prompt, requests


# ---- the host processes ---------------------------------------------------------------------

def _error_payload(e: BaseException) -> Dict[str, Any]:
    p: Dict[str, Any] = {"kind": type(e).__name__, "message": str(e),
                         "trace": traceback.format_exc(limit=8)}
    for a in ("detail", "operation", "subject", "hint"):
        if hasattr(e, a):
            p[a] = getattr(e, a)
    return p


def _setup(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _warm_up(model: Any, kv: KvSpec) -> None:
    """One short prefill, so the first measured one pays no first-call costs."""
    import torch

    model.prefill(torch.arange(2 * kv.tokens_per_block) % model.cfg.vocab,
                  model.new_cache(kv, 2 * kv.tokens_per_block))


def publisher(cfg: DemoConfig, prompt: List[int], out: Any, go: Any) -> None:
    """Host A: prefill the system prompt, publish its blocks, stay joined until told."""
    try:
        _setup(cfg.threads)
        import cxlkv
        import torch

        from . import share
        from .model import TinyDecoder

        spec = cfg.a
        model = TinyDecoder(spec.model)
        fp = model.fingerprint()
        ns = share.model_namespace(cfg.tenant, model, spec.kv, fp)
        domain = cxlkv.Domain.join(cfg.domain, cfg.hosts[0], heartbeat_s=0.05)
        try:
            domain.grow(spec.kv.layout(spec.model))
            _warm_up(model, spec.kv)
            cache = model.new_cache(spec.kv, len(prompt))
            t0 = time.perf_counter()
            model.prefill(torch.tensor(prompt), cache)
            prefill_s = time.perf_counter() - t0
            pub = share.publish_prefix(domain, cfg.tenant, model, spec.kv, fp, prompt, cache)
            out.put(("published", {
                "host": cfg.hosts[0], "model": share.model_name(model, fp), "fingerprint": fp,
                "parameters": model.parameters_count(), "namespace": f"{ns.id:#018x}",
                "kv_layout": spec.kv.describe(spec.model), "block_bytes": cache.block_bytes,
                "prompt_tokens": len(prompt), "prefill_s": prefill_s, "blocks": pub.blocks,
                "bytes": pub.bytes, "publish_s": pub.publish_s,
            }))
            go.get(timeout=cfg.timeout_s)
        finally:
            domain.leave()
        out.put(("left", cfg.hosts[0]))
    except BaseException as e:  # reported to the driver, which raises it
        out.put(("error", "A", _error_payload(e)))


def _cold(model: Any, kv: KvSpec, tokens: Any) -> Tuple[Any, Any, float, int]:
    cache = model.new_cache(kv, tokens.numel())
    before = model.tokens_computed
    t0 = time.perf_counter()
    logits = model.prefill(tokens, cache)
    return logits, cache, time.perf_counter() - t0, model.tokens_computed - before


def _shared(model: Any, domain: Any, ns: Any, kv: KvSpec, tokens: Any, token_list: List[int]
            ) -> Tuple[Any, Any, float, int, Any, float]:
    from . import share

    cache = model.new_cache(kv, tokens.numel())
    before = model.tokens_computed
    t0 = time.perf_counter()
    loaded = share.load_prefix(domain, ns, kv, token_list, cache)
    t1 = time.perf_counter()
    logits = model.prefill(tokens[cache.length:], cache)
    t2 = time.perf_counter()
    return logits, cache, t2 - t0, model.tokens_computed - before, loaded, t2 - t1


def server(cfg: DemoConfig, prompt: List[int], requests: List[List[int]], out: Any) -> None:
    """Host B: check the publisher's manifest, then serve each request cold and shared."""
    try:
        _setup(cfg.threads)
        import cxlkv
        import torch

        from . import share
        from .model import TinyDecoder

        spec = cfg.b_spec
        model = TinyDecoder(spec.model)
        fp = model.fingerprint()
        ns = share.model_namespace(cfg.tenant, model, spec.kv, fp)
        domain = cxlkv.Domain.join(cfg.domain, cfg.hosts[1], heartbeat_s=0.05)
        try:
            published = share.wait_for_manifest(domain, cfg.tenant, prompt, cfg.timeout_s)
            mine = share.manifest(model, spec.kv, fp, ns, 0, cfg.hosts[1])
            share.check_publisher(published, mine, repr(domain))
            # Every block of the prompt visible (the manifest went last, on the same ring).
            last = ns.chain_keys(prompt, spec.kv.tokens_per_block)[published["blocks"] - 1]
            end = time.monotonic() + cfg.timeout_s
            while domain.lookup(ns, last) is None:
                if time.monotonic() > end:
                    raise TimeoutError(f"the prompt's last block is not visible in {domain!r}")
                time.sleep(0.002)
            _warm_up(model, spec.kv)
            served = []
            for i, token_list in enumerate(requests):
                tokens = torch.tensor(token_list)
                if i % 2 == 0:
                    cold = _cold(model, spec.kv, tokens)
                    shared = _shared(model, domain, ns, spec.kv, tokens, token_list)
                else:
                    shared = _shared(model, domain, ns, spec.kv, tokens, token_list)
                    cold = _cold(model, spec.kv, tokens)
                lc, cc, ttft_cold, ran_cold = cold
                ls, cs, ttft_shared, ran_shared, loaded, rest_s = shared
                k = loaded.blocks_loaded
                served.append({
                    "tokens": len(token_list), "blocks_leased": loaded.blocks_leased,
                    "blocks_loaded": k, "tokens_loaded": cs.length - ran_shared,
                    "tokens_run_cold": ran_cold, "tokens_run_shared": ran_shared,
                    "bytes_copied": loaded.bytes_copied, "ttft_cold_s": ttft_cold,
                    "ttft_shared_s": ttft_shared, "lease_s": loaded.lease_s,
                    "copy_s": loaded.copy_s, "prefill_rest_s": rest_s,
                    "logits_identical": bool(torch.equal(lc, ls)),
                    "logits_max_abs_diff": float((lc - ls).abs().max()),
                    "logits_allclose": bool(torch.allclose(ls, lc, rtol=cfg.rtol,
                                                           atol=cfg.atol)),
                    "next_token_cold": int(lc.argmax()), "next_token_shared": int(ls.argmax()),
                    "kv_identical": bool(torch.equal(cs.blocks[:k], cc.blocks[:k])),
                })
            out.put(("served", {"host": cfg.hosts[1], "model": share.model_name(model, fp),
                                "requests": served}))
        finally:
            domain.leave()
    except BaseException as e:
        out.put(("error", "B", _error_payload(e)))


# ---- the driver -----------------------------------------------------------------------------

def _raise(role: str, p: Dict[str, Any]) -> None:
    from .share import ModelMismatchError

    if p["kind"] == "ModelMismatchError":
        raise ModelMismatchError(p.get("detail", p["message"]), operation=p.get("operation", ""),
                                 subject=f"host {role}: {p.get('subject', '')}",
                                 hint=p.get("hint"))
    raise DemoError(f"host {role} failed: {p['kind']}: {p['message']}\n{p['trace']}")


def _as_host(fn: Any, parent: int, *args: Any) -> None:
    """A host process's entry: it is killed when the process that started it dies, however that
    dies (PR_SET_PDEATHSIG), so an interrupted or killed demo leaves no host running."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the prctl
        return
    fn(*args)


def run(cfg: DemoConfig) -> Dict[str, Any]:
    """Runs hosts A and B as two processes on `cfg.domain`; returns their reports and a
    summary (:func:`summarize`). Raises what a host raised."""
    if cfg.prompt_tokens < cfg.a.kv.tokens_per_block:
        raise ValueError(f"the prompt ({cfg.prompt_tokens} tokens) must fill at least one "
                         f"block of {cfg.a.kv.tokens_per_block} tokens")
    prompt, requests = workload(cfg)
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    go: Any = ctx.Queue()
    me = os.getpid()
    a = ctx.Process(target=_as_host, args=(publisher, me, cfg, prompt, out, go),
                    name="cxlkv-demo host A")
    b = ctx.Process(target=_as_host, args=(server, me, cfg, prompt, requests, out),
                    name="cxlkv-demo host B")
    procs = [a, b]
    got: Dict[str, Any] = {}
    try:
        for p in procs:
            p.start()
        end = time.monotonic() + cfg.timeout_s
        while "published" not in got or "served" not in got:
            try:
                kind, role_or_host, payload = _get(out, end)
            except queue.Empty:
                dead = [p.name for p in procs if p.exitcode not in (None, 0)]
                raise DemoError(f"timed out after {cfg.timeout_s:.0f} s waiting for the hosts"
                                + (f" ({', '.join(dead)} died)" if dead else "")) from None
            if kind == "error":
                _raise(role_or_host, payload)
            got[kind] = payload
        go.put("leave")
        kind, _, payload = _get(out, time.monotonic() + 30)
        if kind == "error":
            _raise("A", payload)
        for p in procs:
            p.join(30)
            if p.exitcode != 0:
                raise DemoError(f"{p.name} exited with code {p.exitcode}")
    finally:
        go.put("leave")
        for p in procs:
            if p.is_alive():
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    report = {"config": _config_dict(cfg), "publisher": got["published"],
              "server": got["served"]}
    report["summary"] = summarize(report)
    return report


def _get(q: Any, deadline: float) -> Tuple[str, Any, Any]:
    msg = q.get(timeout=max(0.0, deadline - time.monotonic()))
    if msg[0] == "error":
        return msg[0], msg[1], msg[2]
    return msg[0], None, msg[1]


def _config_dict(cfg: DemoConfig) -> Dict[str, Any]:
    d = asdict(replace(cfg, b=cfg.b_spec))
    d["suffix_tokens"] = list(cfg.suffix_tokens)
    d["hosts"] = list(cfg.hosts)
    return d


def summarize(report: Dict[str, Any]) -> Dict[str, Any]:
    """Medians over the requests and the checks' outcome."""
    reqs: Sequence[Dict[str, Any]] = report["server"]["requests"]

    def med(k: str) -> float:
        return statistics.median(r[k] for r in reqs)

    return {
        "requests": len(reqs),
        "ttft_cold_ms": 1e3 * med("ttft_cold_s"),
        "ttft_shared_ms": 1e3 * med("ttft_shared_s"),
        "saved_ms": 1e3 * statistics.median(r["ttft_cold_s"] - r["ttft_shared_s"] for r in reqs),
        "speedup": med("ttft_cold_s") / med("ttft_shared_s"),
        "lease_ms": 1e3 * med("lease_s"),
        "copy_ms": 1e3 * med("copy_s"),
        "prefill_rest_ms": 1e3 * med("prefill_rest_s"),
        "bytes_copied_per_request": med("bytes_copied"),
        "copy_gb_per_s": sum(r["bytes_copied"] for r in reqs) / max(
            1e-12, sum(r["copy_s"] for r in reqs)) / 1e9,
        "blocks_loaded": [r["blocks_loaded"] for r in reqs],
        "all_logits_close": all(r["logits_allclose"] for r in reqs),
        "all_logits_identical": all(r["logits_identical"] for r in reqs),
        "max_logits_abs_diff": max(r["logits_max_abs_diff"] for r in reqs),
        "all_next_tokens_equal": all(r["next_token_cold"] == r["next_token_shared"]
                                     for r in reqs),
        "all_kv_identical": all(r["kv_identical"] for r in reqs),
    }
