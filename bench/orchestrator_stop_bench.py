#!/usr/bin/python3
"""How long cxlkv-orchestrator takes to exit on SIGTERM (issue #42 item 5: within 200 ms), with
an [lmcache] section configured, and whether what it acknowledged before the signal is all
there after the restart.

Run (Debian's interpreter; any build of the orchestrator):
    /usr/bin/python3 bench/orchestrator_stop_bench.py \
        --orchestrator build/release/orchestrator/daemon/cxlkv-orchestrator [--runs 20]

Each run starts the orchestrator on the same domain (the first with --new-domain, then on the
state the previous run left; the metrics endpoint on too), waits until it is ready (the RPC
socket accepts, which it does only once every endpoint is up, and the coordinator answers
/healthz), then, by scenario:
  idle        nothing connected;
  lmcache     a kept-alive HTTP client (as LMCache's) that reserved and finished 8 objects
              just before the signal, its connection left open (idle in a server worker);
  rpc-silent  as lmcache, and a connection to the RPC socket that sent HTTP/2's preface and
              then never reads (a client that ignores GOAWAY: the gRPC server's Shutdown
              waits for it until its deadline, 100 ms);
sends SIGTERM and times until waitpid returns (the process has exited: every thread joined,
the state written). The next start then looks up every object finished so far: one missing
fails the run (exit 1). Prints per scenario the median and the maximum over --runs, and the
exit statuses. Loopback only; the domain's files are removed at the end.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "lmcache-qualify"))
from coordinator_client import Client, make_key, make_layout  # noqa: E402
from emulated_domain import EmulatedDomain, exit_on_termination  # noqa: E402

OBJ = 4096


def wait_ready(dom, deadline_s=30):
    """Until the RPC socket accepts and /healthz answers 200 (a start is not timed)."""
    sock_path = str(dom.dir / "o.sock")
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock_path)
            s.close()
            c = Client(dom.port, None)
            st, _ = c.raw("GET", "/healthz", auth=False)
            c.close()
            if st == 200:
                return
        except OSError:
            pass
        finally:
            s.close()
        if dom.proc.poll() is not None:
            break
        time.sleep(0.01)
    raise RuntimeError(f"the orchestrator did not become ready: {dom.log_text()}")


class Domain(EmulatedDomain):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        text = self.config.read_text()
        self.config.write_text(text.replace('[metrics]\nlisten = ""',
                                            '[metrics]\nlisten = "127.0.0.1:0"'))

    def log_text(self):
        self.log.seek(0)
        return self.log.read()


def run_once(dom, scenario, token, finished, next_id):
    """One start, check, (load) and SIGTERM; returns (seconds to exit, exit status, next id)."""
    dom.start()
    wait_ready(dom)
    c = Client(dom.port, token)
    c.region()
    if finished:
        found = c.lookup([make_key(i) for i in finished])
        missing = [i for i, r in zip(finished, found) if r is None]
        if missing:
            raise RuntimeError(f"{len(missing)} of {len(finished)} objects finished before "
                               f"SIGTERM are missing after the restart (first: {missing[0]})")
    held = []
    if scenario in ("lmcache", "rpc-silent"):
        keys = [make_key(i) for i in range(next_id, next_id + 8)]
        grants = c.reserve([(k, make_layout(OBJ)) for k in keys])
        c.finish(grants)
        finished.extend(range(next_id, next_id + 8))
        next_id += 8
        held = [c]
    if scenario == "rpc-silent":
        rpc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        rpc.connect(str(dom.dir / "o.sock"))
        # The client preface and an empty SETTINGS frame; then nothing.
        rpc.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        held.append(rpc)
    else:
        c.close()
    # A blocking waitpid (Popen.wait with a timeout polls, up to 50 ms late); a watchdog ends
    # an orchestrator that ignores the signal.
    watchdog = threading.Timer(30, dom.proc.kill)
    watchdog.start()
    t0 = time.perf_counter()
    dom.proc.send_signal(signal.SIGTERM)
    rc = dom.proc.wait()
    dt = time.perf_counter() - t0
    watchdog.cancel()
    for h in held:
        h.close()
    return dt, rc, next_id


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orchestrator", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    exit_on_termination()
    dom = Domain(args.orchestrator, pool_mib=256, region_mib=32, extent_mib=16,
                 tokens={"default": "stop-bench-token-0123456789"})
    token = dom.tokens["default"]
    print(f"domain files: {dom.removal} (if this run is killed -9)", file=sys.stderr)
    results = {}
    try:
        finished, next_id = [], 0
        for scenario in ("idle", "lmcache", "rpc-silent"):
            ts, rcs = [], []
            for _ in range(args.runs):
                dt, rc, next_id = run_once(dom, scenario, token, finished, next_id)
                ts.append(dt)
                rcs.append(rc)
            # The last run's objects are looked up by one more start.
            dom.start()
            wait_ready(dom)
            c = Client(dom.port, token)
            c.region()
            found = c.lookup([make_key(i) for i in finished]) if finished else []
            c.close()
            dom.proc.send_signal(signal.SIGTERM)
            dom.proc.wait(30)
            if any(r is None for r in found):
                raise RuntimeError("objects finished before the last SIGTERM are missing")
            results[scenario] = {"runs": len(ts), "median_ms": statistics.median(ts) * 1e3,
                                 "max_ms": max(ts) * 1e3, "min_ms": min(ts) * 1e3,
                                 "exit_statuses": sorted(set(rcs)),
                                 "runs_ms": [round(t * 1e3, 1) for t in ts],
                                 "objects_checked": len(finished)}
            r = results[scenario]
            print(f"{scenario:10s} SIGTERM to exit: median {r['median_ms']:7.1f} ms  "
                  f"max {r['max_ms']:7.1f} ms (run {ts.index(max(ts)) + 1})  min {r['min_ms']:7.1f} ms  ({r['runs']} runs, "
                  f"exit {r['exit_statuses']}, {r['objects_checked']} objects all there after "
                  "restart)", flush=True)
    finally:
        dom.close()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "loadavg": load}, indent=1))
    return 0 if all(r["exit_statuses"] == [0] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
