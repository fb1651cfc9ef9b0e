"""A cxlkv domain with [lmcache] on an emulated pool (files in /dev/shm), its orchestrator as a
child process: what lmcache_qualify.py --launch and the coordinator benchmark run against.
Loopback only.

Everything it creates lives in two directories, removed by close(): one in /dev/shm (the pool,
the prefix domain and, with state_dir="/dev/shm", the state file with what the orchestrator
puts beside it: .lock, .lmcache, .lmcache.journal, .tmp) and one in the temporary directory
(domain.toml, the tokens, the RPC socket, the orchestrator's logs and, by default, the state
file). `removal` names both, for a message printed at start: a kill -9 of this process leaves
them, and the orchestrator, which dies with its parent (PR_SET_PDEATHSIG), then removes
nothing. exit_on_termination() makes SIGTERM and SIGHUP run the caller's finally blocks."""

import ctypes
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20
_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """A preexec_fn: the child gets SIGTERM when the process that started it dies, however it
    dies (kill -9 included), so no orchestrator or worker outlives a killed run."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def exit_on_termination():
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread, as SIGINT raises
    KeyboardInterrupt, so `finally` and `with` blocks remove what the run created."""
    def handler(sig, _frame):
        raise SystemExit(128 + sig)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


class EmulatedDomain:
    def __init__(self, binary, pool_mib=512, region_mib=128, extent_mib=16, alignment=4096,
                 ttl_ms=1000, lease_ms=500, tenants=("default",), quotas=None,
                 state_dir=None, threads=8, name="lmq", layout_id="qualify", tokens=None,
                 max_batch=4096, extra_toml="", lmcache_toml="", index_entries=1024,
                 region_bytes=None):
        """tokens: {tenant: token} (default: a random token per tenant of `tenants`);
        region_bytes: the region's size in bytes, any (instead of region_mib), e.g. LMCache's
        tests' 64 KiB: it starts at the pool's last extents that hold it;
        extra_toml: appended to domain.toml (e.g. [[namespace]] entries); lmcache_toml: more
        [lmcache] keys (e.g. index_wait_ms = 300); index_entries: the prefix index's size (the
        coordinator's finished objects are entries there)."""
        prefix_mib = max(4, (index_entries * 64 >> 20) + 2)
        self.binary = binary
        self.proc = None
        self.log = None
        # Each directory is recorded as soon as it exists: close() removes what is there.
        self.dirs = []
        self.dir = Path(tempfile.mkdtemp(prefix="cxlkv-lmq-"))
        self.dirs.append(self.dir)
        self.shm_dir = Path(tempfile.mkdtemp(prefix="cxlkv-lmq-", dir="/dev/shm"))
        self.dirs.append(self.shm_dir)
        # The state file and what the orchestrator creates beside it (docs/orchestrator.md
        # "Files on disk") in a directory of their own, so nothing of them outlives close().
        if not state_dir:
            state_home = self.dir
        elif Path(state_dir).resolve() == self.shm_dir.parent.resolve():
            state_home = self.shm_dir
        else:
            state_home = Path(tempfile.mkdtemp(prefix="cxlkv-lmq-", dir=state_dir))
            self.dirs.append(state_home)
        self.state_file = state_home / "domain.state"
        self.pool = str(self.shm_dir / "pool")
        self.prefix = str(self.shm_dir / "domain")
        self.pool_bytes = pool_mib * MiB
        self.region_bytes = region_bytes if region_bytes is not None else region_mib * MiB
        extent = extent_mib * MiB
        self.region_offset = self.pool_bytes - -(-self.region_bytes // extent) * extent
        self.tokens = dict(tokens) if tokens else {t: secrets.token_hex(16) for t in tenants}
        self.token_file = self.dir / "tokens"
        self.token_file.write_text("".join(f"{t} {v}\n" for t, v in self.tokens.items()))
        self.token_file.chmod(0o600)
        quota_text = "".join(f"{t} = {b}\n" for t, b in (quotas or {}).items())
        self.config = self.dir / "domain.toml"
        self.config.write_text(f"""[domain]
name = "{name}"
pool = "file:{self.pool}?size={pool_mib}M"
prefix_domain = "file:{self.prefix}?size={prefix_mib}M"
extent_size = "{extent_mib}M"
state_file = "{self.state_file}"
index_entries = {index_entries}
max_hosts = 4
[rpc]
socket = "{self.dir}/o.sock"
[metrics]
listen = ""
[lmcache]
listen = "127.0.0.1:0"
token_file = "{self.token_file}"
layout_id = "{layout_id}"
region_size = {self.region_bytes}
alignment = {alignment}
reservation_ttl_ms = {ttl_ms}
read_lease_ms = {lease_ms}
threads = {threads}
max_batch = {max_batch}
{lmcache_toml}
[lmcache.quotas]
{quota_text}{extra_toml}""")
        self.port = None
        self.started = False

    @property
    def removal(self):
        """What this domain leaves if its process is killed with -9, as a command."""
        return "rm -rf " + " ".join(str(d) for d in self.dirs)

    def start(self):
        args = [self.binary, "--config", str(self.config)]
        if not self.started:
            args.append("--new-domain")
        self.started = True
        if self.log is not None:
            self.log.close()
        self.log = open(self.dir / f"log-{time.monotonic_ns()}", "w+")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log,
                                     preexec_fn=die_with_parent)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.log.seek(0)
            m = re.search(r"lmcache coordinator on http://127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.log.seek(0)
        raise RuntimeError(f"the orchestrator did not come up: {self.log.read()}")

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        self.proc.wait(10)

    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        """Stops the orchestrator and removes every file of the domain. Idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                print(f"emulated domain: orchestrator pid {self.proc.pid} ignored SIGTERM for "
                      "10 s: killed", file=sys.stderr)
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()
            self.log = None
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
