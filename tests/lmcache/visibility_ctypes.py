#!/usr/bin/python3
"""liblmcache_shared_l1_visibility.so loaded with ctypes the way LMCache loads it.

LMCache's MP server (lmcache/v1/distributed/shared_l1/visibility.py, 2026-09) takes the
library's absolute path, loads it with ctypes.CDLL(path, use_errno=True), looks up
lmcache_shared_l1_visibility_v1, declares its seven argument types, and calls it with
b"software_fenced", the operation (1 publish, 2 acquire), the device descriptor, the local
address of the object (from ctypes.addressof over its mmap), the object's device offset (the
mapping offset included), its length and its generation; a nonzero result is a negative
errno it turns into an error message. This test does the same, in two processes that map one
shared file at different addresses (as two hosts map one device-DAX pool): objects written and
published by one are acquired and read by the other, both ways; then the errors, as LMCache
would report them.

Usage: visibility_ctypes.py LIBRARY_PATH   (exit 0: pass). Seeded: CXLKV_SEED, printed.
On this machine the caches are coherent, so the bytes would arrive without the library too:
what this checks is the contract as LMCache exercises it (loading, types, addresses, offsets,
results). That each call writes back or invalidates the exact range, and that leaving either
out loses data on non-coherent memory, is tests/lmcache_visibility_test.cc's part.
"""

import ctypes
import errno
import hashlib
import mmap
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

PUBLISH = 1
ACQUIRE = 2
SYMBOL = "lmcache_shared_l1_visibility_v1"
GRANULARITY = 64
MAPPING_OFFSET = 4096  # LMCache's --l1-shared-mapping-offset-bytes in its examples
REGION_BYTES = 4 << 20


class Visibility:
    """LMCache's loader, step for step (NativeDeviceDaxVisibility)."""

    def __init__(self, library_path):
        path = Path(library_path)
        if not path.is_absolute() or not path.is_file():
            raise ValueError("shared-L1 visibility library must be an absolute regular file")
        try:
            library = ctypes.CDLL(str(path), use_errno=True)
            function = getattr(library, SYMBOL)
        except (OSError, AttributeError) as exc:
            raise RuntimeError(f"{path} does not provide {SYMBOL}") from exc
        function.argtypes = [
            ctypes.c_char_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_uint64,
            ctypes.c_size_t,
            ctypes.c_uint64,
        ]
        function.restype = ctypes.c_int
        self.library = library
        self.function = function

    def raw(self, mode, operation, fd, address, device_offset, length, generation):
        return self.function(mode, operation, fd, ctypes.c_void_p(address), device_offset,
                             length, generation)

    def apply(self, operation, fd, address, device_offset, length, generation):
        result = self.raw(b"software_fenced", operation, fd, address, device_offset, length,
                          generation)
        if result:
            number = -int(result)
            detail = os.strerror(number) if 0 < number < 4096 else f"native status {result}"
            raise RuntimeError(f"shared-L1 visibility operation {operation} failed: {detail}")


class Region:
    """One process's mapping of the shared pool, as LMCache's SharedL1Client maps it."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.mapping = mmap.mmap(self.fd, REGION_BYTES, flags=mmap.MAP_SHARED,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=MAPPING_OFFSET)
        self.marker = ctypes.c_ubyte.from_buffer(self.mapping)
        self.base = ctypes.addressof(self.marker)
        if self.base % GRANULARITY:
            raise RuntimeError("mapping base is not visibility-aligned")

    def close(self):
        del self.marker
        self.mapping.close()
        os.close(self.fd)


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def write_object(vis, region, rng, offset, length, generation):
    payload = rng.randbytes(length)
    region.mapping[offset:offset + length] = payload
    vis.apply(PUBLISH, region.fd, region.base + offset, MAPPING_OFFSET + offset, length, generation)
    return hashlib.sha256(payload).hexdigest()


def read_object(vis, region, offset, length, generation):
    vis.apply(ACQUIRE, region.fd, region.base + offset, MAPPING_OFFSET + offset, length, generation)
    return hashlib.sha256(region.mapping[offset:offset + length]).hexdigest()


def peer(library, path, seed):
    """The other process: answers the parent's messages on stdin/stdout, one line each."""
    vis = Visibility(library)
    region = Region(path)
    rng = random.Random(seed ^ 0x5EED)
    for line in sys.stdin:
        words = line.split()
        if words[0] == "read":  # read OFFSET LENGTH GENERATION -> digest
            offset, length, generation = map(int, words[1:])
            print(read_object(vis, region, offset, length, generation), flush=True)
        elif words[0] == "write":  # write OFFSET LENGTH GENERATION -> digest of what it wrote
            offset, length, generation = map(int, words[1:])
            print(write_object(vis, region, rng, offset, length, generation), flush=True)
        elif words[0] == "address":
            print(region.base, flush=True)
        elif words[0] == "quit":
            break
    region.close()


def check_objects_cross_processes(library, path, seed):
    vis = Visibility(library)
    region = Region(path)
    child = subprocess.Popen([sys.executable, __file__, library, "--peer", path, str(seed)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(line):
        child.stdin.write(line + "\n")
        child.stdin.flush()
        answer = child.stdout.readline().strip()
        if not answer:
            fail(f"the peer process died on '{line}' (exit {child.poll()})")
        return answer

    if int(ask("address")) == region.base:
        print("note: both processes mapped the pool at the same address")
    rng = random.Random(seed)
    # A bump allocator of 64-byte-aligned extents, as LMCache's coordinator hands them out.
    next_offset = 0
    for generation in range(1, 101):
        length = rng.choice([64, 100, 4096, 5000, rng.randrange(1, 65536)])
        if next_offset + length > REGION_BYTES:
            next_offset = 0
        offset = next_offset
        next_offset = (offset + length + GRANULARITY - 1) // GRANULARITY * GRANULARITY
        if generation % 2:
            digest = write_object(vis, region, rng, offset, length, generation)
            got = ask(f"read {offset} {length} {generation}")
            who = "this process wrote, the peer read"
        else:
            digest = ask(f"write {offset} {length} {generation}")
            got = read_object(vis, region, offset, length, generation)
            who = "the peer wrote, this process read"
        if got != digest:
            fail(f"object {generation} at [{offset}, +{length}): {who} other bytes")
    child.stdin.write("quit\n")
    child.stdin.close()
    if child.wait(timeout=30) != 0:
        fail(f"peer exited with {child.returncode}")
    region.close()
    print("objects across two processes: 100 published and acquired, bytes equal")


def check_errors(library, path):
    vis = Visibility(library)
    region = Region(path)
    a = region.base
    closed = os.dup(region.fd)
    os.close(closed)
    cases = [
        ("unknown mode", (b"coherent", PUBLISH, region.fd, a, MAPPING_OFFSET, 64, 1),
         errno.EOPNOTSUPP),
        ("no mode", (None, ACQUIRE, region.fd, a, MAPPING_OFFSET, 64, 1), errno.EINVAL),
        ("operation 3", (b"software_fenced", 3, region.fd, a, MAPPING_OFFSET, 64, 1),
         errno.EINVAL),
        ("closed descriptor", (b"software_fenced", PUBLISH, closed, a, MAPPING_OFFSET, 64, 1),
         errno.EBADF),
        ("null address", (b"software_fenced", ACQUIRE, region.fd, 0, MAPPING_OFFSET, 64, 1),
         errno.EFAULT),
        ("misaligned address", (b"software_fenced", PUBLISH, region.fd, a + 8, MAPPING_OFFSET + 8,
                                64, 1), errno.EINVAL),
        ("zero length", (b"software_fenced", PUBLISH, region.fd, a, MAPPING_OFFSET, 0, 1),
         errno.EINVAL),
    ]
    for what, args, want in cases:
        got = vis.raw(*args)
        if got != -want:
            fail(f"{what}: returned {got}, expected -{errno.errorcode[want]} ({-want})")
    # What LMCache's apply() makes of a failure: a readable message.
    try:
        vis.apply(3, region.fd, a, MAPPING_OFFSET, 64, 1)
        fail("operation 3 did not fail")
    except RuntimeError as exc:
        if os.strerror(errno.EINVAL) not in str(exc):
            fail(f"unreadable error: {exc}")
    # LMCache's generation is an unsigned 64-bit counter: any value is accepted.
    if vis.raw(b"software_fenced", PUBLISH, region.fd, a, MAPPING_OFFSET, 64, 2**64 - 1) != 0:
        fail("the largest generation was refused")
    region.close()
    print(f"errors: {len(cases)} bad calls refused with their errno")


def check_versions(library):
    lib = ctypes.CDLL(library, use_errno=True)
    for name in ("lmcache_shared_l1_visibility_v2", "lmcache_shared_l1_visibility"):
        if hasattr(lib, name):
            fail(f"{name} is exported: a loader asking for another version would find it")
    # A loader pinned to a version this library does not have refuses it (LMCache's message).
    try:
        getattr(lib, "lmcache_shared_l1_visibility_v2")
        fail("v2 found")
    except AttributeError:
        pass
    nm = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True)
    if nm.returncode == 0:
        exported = [l.split()[-1] for l in nm.stdout.splitlines() if l.split()]
        if exported != [SYMBOL]:
            fail(f"the library exports {exported}, expected only {SYMBOL}")
    try:
        Visibility(os.path.relpath(library))
        fail("a relative path was accepted")
    except ValueError:
        pass
    print("versions: only the v1 symbol is exported")


def main():
    if len(sys.argv) >= 5 and sys.argv[2] == "--peer":
        peer(sys.argv[1], sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    library = os.path.abspath(sys.argv[1])
    seed = int(os.environ.get("CXLKV_SEED", random.SystemRandom().randrange(2**32)))
    print(f"seed {seed} (replay: CXLKV_SEED={seed})")
    fd, path = tempfile.mkstemp(prefix="cxlkv-lmcache-pool-", dir="/dev/shm")
    try:
        os.ftruncate(fd, MAPPING_OFFSET + REGION_BYTES)
        os.close(fd)
        check_versions(library)
        check_objects_cross_processes(library, path, seed)
        check_errors(library, path)
    finally:
        os.unlink(path)
    print("PASS")


if __name__ == "__main__":
    main()
