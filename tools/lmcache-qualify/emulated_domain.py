"""A cxlkv domain with [lmcache] on an emulated pool (files in /dev/shm), its orchestrator as a
child process: what lmcache_qualify.py --launch and the coordinator benchmark run against.
Loopback only."""

import os
import re
import secrets
import signal
import subprocess
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


class EmulatedDomain:
    def __init__(self, binary, pool_mib=512, region_mib=128, extent_mib=16, alignment=4096,
                 ttl_ms=1000, lease_ms=500, tenants=("default",), quotas=None,
                 state_dir=None, threads=8, name="lmq", layout_id="qualify", tokens=None,
                 max_batch=4096, extra_toml="", lmcache_toml="", index_entries=1024):
        """tokens: {tenant: token} (default: a random token per tenant of `tenants`);
        extra_toml: appended to domain.toml (e.g. [[namespace]] entries); lmcache_toml: more
        [lmcache] keys (e.g. index_wait_ms = 300); index_entries: the prefix index's size (the
        coordinator's finished objects are entries there)."""
        prefix_mib = max(4, (index_entries * 64 >> 20) + 2)
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="cxlkv-lmq-"))
        state_dir = Path(state_dir) if state_dir else self.dir
        self.state_file = state_dir / f"cxlkv-lmq-{os.getpid()}-{secrets.token_hex(3)}.state"
        tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.pool = f"/dev/shm/cxlkv-lmq-pool-{tag}"
        self.prefix = f"/dev/shm/cxlkv-lmq-domain-{tag}"
        self.pool_bytes = pool_mib * MiB
        self.region_bytes = region_mib * MiB
        self.region_offset = self.pool_bytes - self.region_bytes
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
region_size = "{region_mib}M"
alignment = {alignment}
reservation_ttl_ms = {ttl_ms}
read_lease_ms = {lease_ms}
threads = {threads}
max_batch = {max_batch}
{lmcache_toml}
[lmcache.quotas]
{quota_text}{extra_toml}""")
        self.proc = None
        self.port = None
        self.started = False
        self.log = None

    def start(self):
        args = [self.binary, "--config", str(self.config)]
        if not self.started:
            args.append("--new-domain")
        self.started = True
        self.log = open(self.dir / f"log-{time.monotonic_ns()}", "w+")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
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
        if self.proc and self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        for p in (self.pool, self.prefix, str(self.state_file),
                  str(self.state_file) + ".lmcache"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        subprocess.run(["rm", "-rf", str(self.dir)], check=False)
