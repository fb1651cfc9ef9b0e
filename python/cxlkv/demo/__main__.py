"""``python -m cxlkv.demo``: the shared-prefix serving demo (see ``cxlkv.demo``).

Exit status: 0 when every request's logits with the shared prefix equal the from-scratch
run's (within --rtol/--atol) and the prompt's blocks were loaded; 1 when a check fails or a
host fails (the error is printed); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from dataclasses import fields, replace
from typing import Any, Dict, List, Optional

from .hosts import DemoConfig, DemoError, HostSpec
from .model import KvSpec, ModelConfig


def _override(spec: HostSpec, items: List[str], parser: argparse.ArgumentParser) -> HostSpec:
    """Applies KEY=VALUE items to a host's model config or KV spec."""
    model, kv = spec.model, spec.kv
    model_keys = {f.name: f for f in fields(ModelConfig)}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--b-override {item!r}: expected KEY=VALUE")
        if key == "tokens_per_block":
            kv = KvSpec(tokens_per_block=int(value))
        elif key in model_keys:
            cast: Any = type(getattr(model, key))
            model = replace(model, **{key: cast(value)})
        else:
            parser.error(f"--b-override {key}: not one of {', '.join(model_keys)}, "
                         "tokens_per_block")
    return HostSpec(model, kv)


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cxlkv.demo",
        description="Two serving processes of a small transformer on two hosts of one cxlkv "
        "domain: host A prefills and publishes a shared system prompt's KV blocks; host B "
        "serves requests that start with it, loading those blocks instead of recomputing "
        "them, and checks its logits against a from-scratch run.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--socket", help="a running cxlkv-orchestrator's RPC socket")
    where.add_argument("--domain", help="a domain spec to join (e.g. orchestrator:<socket>)")
    p.add_argument("--orchestrator-bin",
                   help="without --socket/--domain: start this cxlkv-orchestrator on a "
                   "private emulated domain (default: found in the build tree or PATH)")
    p.add_argument("--tenant", default="cxlkv-demo")
    p.add_argument("--hosts", default="2,3", help="host ids of A and B (default 2,3)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--suffix-tokens", default="16:64", help="user tokens per request, MIN:MAX")
    p.add_argument("--seed", type=int, default=7, help="seed of the prompt and requests")
    d = ModelConfig()
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--head-dim", type=int, default=d.head_dim)
    p.add_argument("--mlp", type=int, default=d.mlp)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--model-seed", type=int, default=d.seed, help="seed of the weights")
    p.add_argument("--tokens-per-block", type=int, default=KvSpec().tokens_per_block)
    p.add_argument("--b-override", action="append", default=[], metavar="KEY=VALUE",
                   help="run host B with another model or KV layout (e.g. layers=5, "
                   "tokens_per_block=8): a different one refuses the prompt")
    p.add_argument("--threads", type=int, default=1, help="torch threads per host process")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds")
    p.add_argument("--json", help="write the full report (every request) to this file")
    args = p.parse_args(argv)
    try:
        args.hosts_t = tuple(int(x) for x in args.hosts.split(","))
        lo, hi = (int(x) for x in args.suffix_tokens.split(":"))
    except ValueError:
        p.error("--hosts takes A,B and --suffix-tokens MIN:MAX, as integers")
    if len(args.hosts_t) != 2 or args.hosts_t[0] == args.hosts_t[1]:
        p.error("--hosts takes two different host ids")
    if not 1 <= lo <= hi:
        p.error("--suffix-tokens: need 1 <= MIN <= MAX")
    args.suffix = (lo, hi)
    model = ModelConfig(vocab=args.vocab, layers=args.layers, heads=args.heads,
                        head_dim=args.head_dim, mlp=args.mlp, seed=args.model_seed)
    try:
        model.validate()
    except ValueError as e:
        p.error(str(e))
    args.a = HostSpec(model, KvSpec(args.tokens_per_block))
    args.b = _override(args.a, args.b_override, p) if args.b_override else None
    return args


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def print_report(r: Dict[str, Any]) -> None:
    a, b, s = r["publisher"], r["server"], r["summary"]
    cfg = r["config"]
    m = cfg["a"]["model"]
    print(f"model     {a['model']}: {a['parameters'] / 1e6:.1f} M parameters, {m['layers']} "
          f"layers x {m['heads']} heads x {m['head_dim']} head_dim, vocab {m['vocab']}, fp32, "
          f"CPU, {cfg['threads']} thread(s) per host")
    print(f"KV block  {a['kv_layout']}: {a['block_bytes'] // 1024} KiB (keys and values); "
          f"namespace {a['namespace']}")
    print(f"host {a['host']} (A) prefilled the {a['prompt_tokens']}-token system prompt in "
          f"{1e3 * a['prefill_s']:.0f} ms and published {a['blocks']} blocks "
          f"({_mib(a['bytes'])}) in {1e3 * a['publish_s']:.1f} ms")
    lo, hi = cfg["suffix_tokens"]
    print(f"host {b['host']} (B) served {s['requests']} requests (the prompt + {lo}..{hi} user "
          "tokens), each cold (prefill everything) and shared (load the prompt's blocks, "
          "prefill the rest):")
    print(f"  {'req':>3} {'tokens':>6} {'loaded':>10} {'ran cold/shared':>15} {'copied':>9} "
          f"{'TTFT cold':>10} {'TTFT shared':>11} {'= lease + copy + rest':>22} {'saved':>10}"
          "  logits")
    for i, q in enumerate(b["requests"]):
        same = ("identical" if q["logits_identical"] else
                f"close ({q['logits_max_abs_diff']:.1e})" if q["logits_allclose"] else
                f"DIFFER ({q['logits_max_abs_diff']:.1e})")
        ran = f"{q['tokens_run_cold']}/{q['tokens_run_shared']}"
        parts = (f"{1e3 * q['lease_s']:.2f} + {1e3 * q['copy_s']:.2f} + "
                 f"{1e3 * q['prefill_rest_s']:.1f}")
        saved = 1e3 * (q["ttft_cold_s"] - q["ttft_shared_s"])
        print(f"  {i:3d} {q['tokens']:6d} {q['blocks_loaded']:>3d} blocks {ran:>15} "
              f"{_mib(q['bytes_copied']):>9} {1e3 * q['ttft_cold_s']:7.1f} ms "
              f"{1e3 * q['ttft_shared_s']:8.1f} ms {parts:>22} {saved:7.1f} ms  {same}")
    print(f"median    TTFT {s['ttft_cold_ms']:.1f} ms cold -> {s['ttft_shared_ms']:.1f} ms shared "
          f"({s['speedup']:.1f}x; saved {s['saved_ms']:.1f} ms of prefill per request); "
          f"{_mib(s['bytes_copied_per_request'])} copied per request at "
          f"{s['copy_gb_per_s']:.2f} GB/s (lease {s['lease_ms']:.2f} ms, copy "
          f"{s['copy_ms']:.2f} ms)")
    verdict = ("bit-identical" if s["all_logits_identical"] else
               f"equal within rtol={cfg['rtol']:g} atol={cfg['atol']:g} (max |diff| "
               f"{s['max_logits_abs_diff']:.1e})" if s["all_logits_close"] else
               f"NOT equal (max |diff| {s['max_logits_abs_diff']:.1e})")
    print(f"check     next-token logits with the shared prefix vs from scratch: {verdict}; "
          f"next tokens {'equal' if s['all_next_tokens_equal'] else 'DIFFER'}; loaded KV "
          f"{'identical to' if s['all_kv_identical'] else 'DIFFERS from'} B's own prefill")


def ok(r: Dict[str, Any]) -> bool:
    """The checks the exit status reports: logits close, every prompt block loaded."""
    s = r["summary"]
    want = r["publisher"]["blocks"]
    return bool(s["all_logits_close"] and s["all_next_tokens_equal"]
                and all(n == want for n in s["blocks_loaded"]))


def _exit_on_termination() -> None:
    """SIGTERM and SIGHUP raise SystemExit in the main thread, as SIGINT raises
    KeyboardInterrupt: the hosts are stopped and a private domain's files removed on the way
    out."""
    def handler(sig: int, _frame: Any) -> None:
        raise SystemExit(128 + sig)
    if threading.current_thread() is threading.main_thread():  # main() run from a thread: no
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, handler)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(argv)
    from .hosts import run
    from .orchestrator import LocalOrchestrator
    from .share import ModelMismatchError

    _exit_on_termination()
    with contextlib.ExitStack() as stack:
        if args.socket or args.domain:
            domain = args.domain or "orchestrator:" + args.socket
        else:
            try:
                orch = stack.enter_context(LocalOrchestrator(args.orchestrator_bin))
            except (FileNotFoundError, RuntimeError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            print(f"cxlkv.demo: a private orchestrator; its files are removed at exit (after a "
                  f"kill -9: {orch.removal})", file=sys.stderr, flush=True)
            domain = orch.spec
        cfg = DemoConfig(domain=domain, tenant=args.tenant, prompt_tokens=args.prompt_tokens,
                         requests=args.requests, suffix_tokens=args.suffix, seed=args.seed,
                         hosts=args.hosts_t, a=args.a, b=args.b, threads=args.threads,
                         timeout_s=args.timeout, rtol=args.rtol, atol=args.atol)
        try:
            report = run(cfg)
        except (ModelMismatchError, DemoError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print_report(report)
    if not ok(report):
        print("FAILED: the shared prefix did not reproduce the from-scratch logits, or not "
              "every prompt block was loaded", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the hosts and a private domain are gone by now
        print("cxlkv.demo: interrupted", file=sys.stderr)
        sys.exit(130)
