"""A private cxlkv-orchestrator for a demo run without one (and for the tests).

:class:`LocalOrchestrator` writes a configuration for a small emulated domain (its pooled
region and prefix index as files in /dev/shm, a state file and the RPC socket in a temporary
directory), starts ``cxlkv-orchestrator --new-domain`` on it, waits for the socket, and on exit
stops the daemon and removes every file. ``spec`` is what hosts join
(``orchestrator:<socket>``). The daemon dies with the process that started it (it gets SIGTERM
then, PR_SET_PDEATHSIG); after a kill -9 of that process its files stay: ``removal`` is the
command that removes them, for a message printed at start.

The binary is looked for in this order: the `binary` argument, ``$CXLKV_ORCHESTRATOR_BIN``, a
source tree's ``build/<preset>/orchestrator/daemon/cxlkv-orchestrator`` (dev, release, then
any), ``cxlkv-orchestrator`` on PATH.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional

_TREE = Path(__file__).resolve().parents[3]


def find_orchestrator(binary: Optional[str] = None) -> Optional[str]:
    if binary:
        return binary
    env = os.environ.get("CXLKV_ORCHESTRATOR_BIN")
    if env:
        return env
    build = _TREE / "build"
    if build.is_dir():
        presets = [build / "dev", build / "release"]
        presets += sorted(p for p in build.iterdir() if p not in presets)
        for p in presets:
            exe = p / "orchestrator" / "daemon" / "cxlkv-orchestrator"
            if exe.is_file() and os.access(exe, os.X_OK):
                return str(exe)
    return shutil.which("cxlkv-orchestrator")


def _die_with_parent() -> None:
    """A preexec_fn: SIGTERM to the child when the process that started it dies."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


class LocalOrchestrator:
    """A cxlkv-orchestrator on a fresh emulated domain; a context manager."""

    def __init__(self, binary: Optional[str] = None, *, pool_mib: int = 256,
                 extent_mib: int = 64, max_hosts: int = 8) -> None:
        found = find_orchestrator(binary)
        if found is None:
            raise FileNotFoundError(
                "cxlkv-orchestrator not found: build it (cmake --build build/dev --target "
                "cxlkv-orchestrator), set CXLKV_ORCHESTRATOR_BIN, or pass --socket of a running "
                "one")
        self.binary = found
        self.pool_mib, self.extent_mib, self.max_hosts = pool_mib, extent_mib, max_hosts
        self.spec = ""
        self._dir: Optional[Path] = None
        self._shm: List[str] = []
        self._proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def removal(self) -> str:
        """The command that removes this domain's files (what a kill -9 leaves)."""
        return "rm -rf " + " ".join([str(self._dir)] + self._shm)

    def __enter__(self) -> "LocalOrchestrator":
        d = Path(tempfile.mkdtemp(prefix="cxlkv-demo-"))
        self._dir = d
        tag = f"{os.getpid()}-{time.monotonic_ns()}"
        self._shm = [f"/dev/shm/cxlkv-demo-pool-{tag}", f"/dev/shm/cxlkv-demo-index-{tag}"]
        sock = str(d / "orchestrator.sock")
        (d / "domain.toml").write_text(
            f'[domain]\nname = "cxlkv-demo"\n'
            f'pool = "file:{self._shm[0]}?size={self.pool_mib}M"\n'
            f'prefix_domain = "file:{self._shm[1]}?size=16M"\n'
            f'extent_size = "{self.extent_mib}M"\nstate_file = "{d}/domain.state"\n'
            f"max_hosts = {self.max_hosts}\n"
            f'[rpc]\nsocket = "{sock}"\n[metrics]\nlisten = ""\n'
            "[capacity]\ndefault_share = 0.5\n")
        try:
            self._proc = subprocess.Popen(
                [self.binary, "--config", str(d / "domain.toml"), "--new-domain"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
            end = time.monotonic() + 15
            while True:
                try:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(sock)
                    break
                except OSError:
                    if self._proc.poll() is not None or time.monotonic() > end:
                        err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                        raise RuntimeError(f"{self.binary} did not come up: {err[-2000:]}")
                    time.sleep(0.02)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.spec = "orchestrator:" + sock
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        for p in self._shm:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        self._shm = []
