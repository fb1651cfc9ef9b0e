"""Shared fixtures: a CXL domain emulated by files in /dev/shm, an owner, pools with arenas.

Run with Debian's interpreter (it sees python3-numpy/torch/pytest):
    /usr/bin/python3 -m pytest python/tests
The library is found as the package finds it (CXLKV_LIBRARY, ..., the source tree's build);
ctest sets CXLKV_LIBRARY to the build's libcxlkv.so.0.

The suite leaves nothing behind (scripts/leftovers): files in /dev/shm are removed by the
fixtures that name them, tmp_path's directories live in one cxlkv-pytest-* directory of the
temporary directory that the session removes at its end (unless --basetemp names one), and
SIGTERM and SIGHUP stop the session as SIGINT does, through every fixture's teardown.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package in the tree, before any installed one

import cxlkv  # noqa: E402
from cxlkv.pool import layout_for_block_bytes  # noqa: E402

_seq = itertools.count()
_basetemp: Optional[str] = None  # the session's own, removed at its end


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    global _basetemp
    if config.option.basetemp is None:  # pytest's default keeps three runs' in pytest-of-USER
        _basetemp = tempfile.mkdtemp(prefix="cxlkv-pytest-")
        config.option.basetemp = _basetemp

    def interrupt(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt  # the session ends through every fixture's teardown

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _basetemp is not None:
        shutil.rmtree(_basetemp, ignore_errors=True)


def wait_until(cond: Callable[[], object], timeout_s: float = 5.0, what: str = "condition"
               ) -> None:
    """Polls `cond` every 2 ms; fails the test with `what` after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.002)
    if not cond():
        pytest.fail(f"timed out after {timeout_s}s waiting for {what}")


def run_program(args: List[str], timeout_s: float, **kw: Any
                ) -> "subprocess.CompletedProcess[str]":
    """subprocess.run (text, output captured) for a program that removes what it creates when
    it ends: past `timeout_s`, or when the test is interrupted, it gets SIGTERM and 30 s to do
    so (subprocess.run's SIGKILL would leave its files), then SIGKILL. Raises what ended the
    wait (subprocess.TimeoutExpired fails the test)."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kw) as p:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except BaseException:
            p.terminate()
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            raise
    return subprocess.CompletedProcess(args, p.returncode, out, err)


class ShmFiles:
    """Names of fresh files in /dev/shm, removed at teardown."""

    def __init__(self) -> None:
        self.paths: List[str] = []

    def path(self, tag: str) -> str:
        p = f"/dev/shm/cxlkv-pytest-{os.getpid()}-{next(_seq)}-{tag}"
        self.paths.append(p)
        return p

    def cleanup(self) -> None:
        for p in self.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


class Env:
    """A formatted domain with an owner thread, and one pool with an arena in it."""

    def __init__(self, files: ShmFiles, block_bytes: int, blocks: int,
                 geometry: cxlkv.Geometry, pool_bytes: int = 0) -> None:
        self.geometry = geometry
        size = (geometry.bytes_needed() + 4095) // 4096 * 4096
        self.domain_spec = f"file:{files.path('domain')}?size={size}"
        cxlkv.Domain.format(self.domain_spec, geometry)
        self.owner = cxlkv.Owner.open(self.domain_spec).start(0.002)
        self.layout, self.block_bytes = layout_for_block_bytes(block_bytes)
        pool_path = files.path("pool")
        # Room for `blocks` blocks plus the arena's metadata, unless the size is given.
        size = pool_bytes or block_bytes * blocks + (4 << 20)
        with cxlkv.Pool.open(f"file:{pool_path}?size={size}") as p:
            cxlkv.Arena.create(p, self.layout).close()
        self.pool_spec = f"file:{pool_path}"
        self._closers: List[Callable[[], None]] = []

    def arena(self) -> cxlkv.Arena:
        """This process's handle on the shared arena (closed at teardown)."""
        a = cxlkv.Arena.open_spec(self.pool_spec)
        self._closers.append(a.close)
        return a

    def host(self, host_id: int, *, heartbeat_s: Optional[float] = 0.05) -> cxlkv.Domain:
        """A host joined with its own arena handle attached (left at teardown)."""
        a = self.arena()
        d = cxlkv.Domain.join(self.domain_spec, host_id, arenas=[a], heartbeat_s=heartbeat_s)
        self._closers.insert(0, d.leave)
        return d

    def close(self) -> None:
        for c in self._closers:
            c()
        self.owner.close()


@pytest.fixture
def shm() -> Iterator[ShmFiles]:
    f = ShmFiles()
    yield f
    f.cleanup()


@pytest.fixture
def make_env(shm: ShmFiles) -> Iterator[Callable[..., Env]]:
    envs: List[Env] = []

    def make(block_bytes: int = 4096, blocks: int = 256,
             geometry: cxlkv.Geometry = cxlkv.Geometry(), pool_bytes: int = 0) -> Env:
        e = Env(shm, block_bytes, blocks, geometry, pool_bytes)
        envs.append(e)
        return e

    yield make
    for e in envs:
        e.close()


@pytest.fixture
def env(make_env: Callable[..., Env]) -> Env:
    return make_env()


@pytest.fixture
def ns() -> cxlkv.Namespace:
    return cxlkv.Namespace("pytest", "model-a", "layout-1")
