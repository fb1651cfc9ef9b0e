"""Namespaces and prefix keys: determinism across processes, chaining, engine digests."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cxlkv
from cxlkv import _lib
from cxlkv.errors import InvalidArgumentError, KeyLengthError
from cxlkv.keys import key_from_digest
from conftest import HERE


def test_namespace_and_keys_are_the_same_in_another_process(ns: cxlkv.Namespace) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import cxlkv;"
            "n = cxlkv.Namespace('pytest', 'model-a', 'layout-1');"
            "print(n.id, n.chain_keys(range(32), 16)[-1].hex(),"
            " n.digest_key(b'\\x07' * 32, 3).hex())")
    out = subprocess.run([sys.executable, "-c", code, str(HERE.parent)], check=True,
                         capture_output=True, text=True).stdout.split()
    assert int(out[0]) == ns.id
    assert out[1] == ns.chain_keys(range(32), 16)[-1].hex()
    assert out[2] == ns.digest_key(b"\x07" * 32, 3).hex()


def test_namespaces_differ_by_every_part_and_are_length_prefixed() -> None:
    ids = {cxlkv.Namespace(*p).id for p in [("a", "b", "c"), ("a", "b", "d"), ("a", "x", "c"),
                                           ("z", "b", "c"), ("ab", "", "c"), ("a", "b", "")]}
    assert len(ids) == 6
    assert cxlkv.Namespace("ab", "c", "").id != cxlkv.Namespace("a", "bc", "").id


def test_chain_keys_chain_each_block_on_the_one_before(ns: cxlkv.Namespace) -> None:
    tokens = np.arange(50, dtype=np.int64)
    keys = ns.chain_keys(tokens, 16)
    assert len(keys) == 3  # the partial block gets no key
    parent = None
    for i, k in enumerate(keys):
        parent = ns.chain_key(tokens[16 * i:16 * (i + 1)], parent)
        assert parent == k
    # A different first block changes every key after it.
    other = ns.chain_keys(np.r_[[999], tokens[1:]], 16)
    assert all(a != b for a, b in zip(keys, other))


def test_keys_from_torch_and_lists_agree(ns: cxlkv.Namespace) -> None:
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    toks = list(range(100, 132))
    assert ns.chain_keys(torch.tensor(toks), 16) == ns.chain_keys(toks, 16)


def test_digest_keys_are_deterministic_and_separated(ns: cxlkv.Namespace) -> None:
    d32 = hashlib.sha256(b"page").digest()
    k = ns.digest_key(d32)
    assert ns.digest_key(d32.hex()) == k  # SGLang's hex form
    assert ns.digest_key(bytearray(d32)) == k
    assert ns.digest_key(d32, group=1) != k
    assert ns.digest_key(d32, group=1) != ns.digest_key(d32, group=2)
    assert cxlkv.Namespace("pytest", "model-b", "layout-1").digest_key(d32) != k
    assert ns.digest_key(d32[:16]) != ns.digest_key(d32[:16] + bytes(16))
    # Never equal to the key of a token block with the same words.
    words = np.frombuffer(d32, dtype="<u4")
    assert ns.chain_key(words) != k
    # The parent counts.
    assert ns.digest_key(d32, parent=k) != k


# cxlkv_prefix_key_from_digest's frozen format, pinned in tests/capi_tier_test.c
# (TestDigestKeys): namespace 42, digest bytes i * 7 + 1, this parent.
GOLDEN_PARENT = cxlkv.PrefixKey(0x1111222233334444, 0x5555666677778888)
GOLDEN = [  # (digest length, with parent, lo, hi)
    (16, False, 0xFA0BF79F338DB8E0, 0x78D27ECB1C93BEBA),
    (16, True, 0x5AA18338691C3F46, 0xE5C560D7897E925D),
    (32, False, 0x1A5458CD078495D9, 0x5CB8D4E3C2A17851),
    (32, True, 0xF4B3E504F02C8F83, 0x870E3E60D66C466A),
]


@pytest.mark.parametrize("length,with_parent,lo,hi", GOLDEN)
def test_digest_keys_are_the_c_functions_golden_values(length: int, with_parent: bool, lo: int,
                                                       hi: int) -> None:
    d = bytes((i * 7 + 1) & 0xFF for i in range(length))
    parent = GOLDEN_PARENT if with_parent else None
    assert key_from_digest(42, d, parent) == cxlkv.PrefixKey(lo, hi)
    assert key_from_digest(42, d.hex(), parent) == cxlkv.PrefixKey(lo, hi)


def test_namespace_digest_key_is_the_c_key_of_its_id(ns: cxlkv.Namespace) -> None:
    d = hashlib.sha256(b"block 7").digest()
    assert ns.digest_key(d) == key_from_digest(ns.id, d)
    p = ns.digest_key(hashlib.sha256(b"block 6").digest())
    assert ns.digest_key(d, parent=p) == key_from_digest(ns.id, d, p)
    # A KV cache group other than 0 is the namespace with " kv-group <g>" in its layout name,
    # which a C program builds with cxlkv_namespace.
    g3 = cxlkv.Namespace("pytest", "model-a", "layout-1 kv-group 3")
    assert ns.group(3) == g3 and ns.group(0) is ns
    assert ns.digest_key(d, group=3) == key_from_digest(g3.id, d)
    # digest_chain chains each key on the one before, as the C example does.
    ds = [hashlib.sha256(bytes([i])).digest() for i in range(4)]
    chain = ns.digest_chain(ds)
    parent = None
    for dd, key in zip(ds, chain):
        parent = key_from_digest(ns.id, dd, parent)
        assert key == parent


def test_digest_keys_equal_a_c_programs(ns: cxlkv.Namespace, tmp_path: Path) -> None:
    """The same key from a C program linked against the library (not through ctypes)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    include = HERE.parent.parent / "include"
    if cc is None or not (include / "cxlkv" / "cxlkv.h").is_file():
        pytest.skip("needs a C compiler and the source tree's include/")
    lib = Path(_lib.load().realpath)
    src = tmp_path / "k.c"
    src.write_text(r"""
#include <stdio.h>
#include "cxlkv/cxlkv.h"
int main(void) {
  unsigned char d[32];
  for (int i = 0; i < 32; ++i) d[i] = (unsigned char)(0xA0 + i);
  uint64_t ns = cxlkv_namespace("pytest", "model-a", "layout-1");
  uint64_t g2 = cxlkv_namespace("pytest", "model-a", "layout-1 kv-group 2");
  cxlkv_prefix_key a, b, c;
  if (cxlkv_prefix_key_from_digest(ns, NULL, d, 32, &a) ||
      cxlkv_prefix_key_from_digest(ns, &a, d, 16, &b) ||
      cxlkv_prefix_key_from_digest(g2, NULL, d, 32, &c)) return 1;
  printf("%llx %llx %llx %llx %llx %llx\n", (unsigned long long)a.lo, (unsigned long long)a.hi,
         (unsigned long long)b.lo, (unsigned long long)b.hi, (unsigned long long)c.lo,
         (unsigned long long)c.hi);
  return 0;
}
""")
    exe = tmp_path / "k"
    subprocess.run([cc, "-std=c11", f"-I{include}", str(src), str(lib),
                    f"-Wl,-rpath,{lib.parent}", "-o", str(exe)], check=True)
    words = [int(w, 16) for w in subprocess.run([str(exe)], check=True, capture_output=True,
                                                text=True).stdout.split()]
    d = bytes(range(0xA0, 0xC0))
    a = ns.digest_key(d)
    assert [a.lo, a.hi] == words[0:2]
    b = ns.digest_key(d[:16], parent=a)
    assert [b.lo, b.hi] == words[2:4]
    c = ns.digest_key(d, group=2)
    assert [c.lo, c.hi] == words[4:6]


@pytest.mark.parametrize("bad", [b"", b"x" * 15, b"x" * 17, b"x" * 31, b"x" * 33, b"x" * 36])
def test_digest_of_the_wrong_length_names_the_lengths(ns: cxlkv.Namespace, bad: bytes) -> None:
    with pytest.raises(KeyLengthError, match=r"expected 16 or 32 bytes") as e:
        ns.digest_key(bad)
    assert "page hash" in e.value.hint
    assert isinstance(e.value, ValueError)


def test_bad_digest_forms(ns: cxlkv.Namespace) -> None:
    with pytest.raises(KeyLengthError, match="not a hex digest"):
        ns.digest_key("zz" * 32)
    with pytest.raises(KeyLengthError, match="type int"):
        ns.digest_key(12345)  # type: ignore[arg-type]
    with pytest.raises(KeyLengthError, match="group"):
        ns.digest_key(b"x" * 32, group=1 << 32)
    with pytest.raises(InvalidArgumentError, match="parent"):
        ns.digest_key(b"x" * 32, parent=b"y" * 16)  # type: ignore[arg-type]
    with pytest.raises(KeyLengthError, match="expected 16 or 32 bytes"):
        ns.digest_chain([b"x" * 32, b"x" * 20])
    with pytest.raises(InvalidArgumentError, match="namespace id"):
        key_from_digest(-1, b"x" * 32)


def test_prefix_key_bytes_round_trip(ns: cxlkv.Namespace) -> None:
    k = ns.chain_key([1, 2, 3])
    assert cxlkv.PrefixKey.from_bytes(bytes(k)) == k
    assert len({k, cxlkv.PrefixKey.from_bytes(bytes(k))}) == 1
    with pytest.raises(KeyLengthError, match="16 bytes"):
        cxlkv.PrefixKey.from_bytes(b"123")
    with pytest.raises(KeyLengthError):
        cxlkv.PrefixKey(-1, 0)


def test_bad_token_ids(ns: cxlkv.Namespace) -> None:
    with pytest.raises(InvalidArgumentError, match="0..2\\^32-1"):
        ns.chain_key([1, -2, 3])
    with pytest.raises(InvalidArgumentError, match="0..2\\^32-1"):
        ns.chain_key([1 << 32])
    with pytest.raises(InvalidArgumentError, match="one-dimensional"):
        ns.chain_key([[1, 2], [3, 4]])
    with pytest.raises(InvalidArgumentError, match="tokens_per_block"):
        ns.chain_keys([1, 2], 0)
    with pytest.raises(InvalidArgumentError, match="NUL"):
        cxlkv.Namespace("a\0b", "m", "l")


def test_the_one_text_form_round_trips_and_matches_the_library() -> None:
    k = cxlkv.PrefixKey(0x0011223344556677, 0x0123456789ABCDEF)
    assert str(k) == "0123456789abcdef0011223344556677"
    assert repr(k) == "PrefixKey(0123456789abcdef0011223344556677)"
    assert cxlkv.PrefixKey.parse(str(k)) == k
    assert cxlkv.PrefixKey.parse("0x" + str(k).upper()) == k
    for bad in ("", "0123", str(k) + "0", str(k)[:-1] + "g", str(k)[:16] + ":" + str(k)[16:]):
        with pytest.raises(cxlkv.errors.InvalidArgumentError, match="32 hex digits"):
            cxlkv.PrefixKey.parse(bad)


def test_published_key_is_the_orchestrators_keyed_key(tmp_path: Path) -> None:
    # The vector tests/directory_test.cc (PublishedKey.KnownAnswerAndId) pins for the
    # orchestrator, computed outside cxlkv with `openssl dgst -sha256 -hmac`.
    from cxlkv.keys import PrefixKey, publish_key_id, published_key, read_publish_secret
    secret = "cxlkv-test-secret-0123456789abcdef"
    k = PrefixKey(0xfedcba9876543210, 0x0123456789abcdef)
    out = published_key(secret, k)
    assert (out.hi, out.lo) == (0xb0daf149e64c21dd, 0x10a8a6c9b8fc8077)
    assert publish_key_id(secret) == 0xefd585ae30061bb6
    # Without the secret the key a router computes from a known prompt is not what is published.
    assert published_key(secret + "x", k) != out and k != out
    f = tmp_path / "publish.key"
    f.write_text(secret + "\n")
    assert published_key(read_publish_secret(str(f)), k) == out
    with pytest.raises(InvalidArgumentError, match="at least 16 bytes"):
        published_key("short", k)


def test_name_keys_are_the_c_functions_golden_values() -> None:
    """LMCache's objects in the domain's index: key_from_name over lmcache_index_name, pinned
    to the values tests/key_test.cc pins for coherence::NameKey."""
    name = cxlkv.lmcache_index_name("00ff", "llama", 3, 1, "salt")
    assert name == b"00ff\x1fllama\x1f3\x1f1\x1fsalt"
    assert cxlkv.lmcache_index_name("abcd", "m", 0) == b"abcd\x1fm\x1f0\x1f0\x1f"
    k = cxlkv.key_from_name(42, cxlkv.lmcache_index_name("00ff", "llama", 3, 1, "salt"))
    assert (k.lo, k.hi) == (0x519EBCEFED477DAA, 0x1209500162F25A1C)
    k0 = cxlkv.key_from_name(42, b"")
    assert (k0.lo, k0.hi) == (0xF2F85EE3469D559F, 0x2F464639C2BB76CA)
    assert cxlkv.key_from_name(42, "x") == cxlkv.key_from_name(42, b"x")
    with pytest.raises(cxlkv.errors.InvalidArgumentError):
        cxlkv.key_from_name(-1, b"x")


# tests/capi_lmcache_key_test.cc's golden key: tenant "t", layout_id "L1", the key
# ("00ff", "llama", 3, 1, "salt"); its namespace is Namespace("t", "lmcache", "L1").id.
LMCACHE_GOLDEN_NS = 0xE6932E96B439C49A
LMCACHE_GOLDEN_LO, LMCACHE_GOLDEN_HI = 0xDA8301E8FCF7323B, 0x894BFD1DF02FFFB1

# Keys at the edges of what LMCache accepts (tests/capi_lmcache_key_test.cc has the same).
LMCACHE_EDGE_KEYS = [
    ("00ff", "llama", 3, 1, "salt"),
    ("", "m", 0, 0, ""),
    ("0123456789abcdef0123456789abcdef", "Qwen/Qwen3-8B", 0, 0, ""),
    ("ab", "\u6a21\u578b-m\u00f6del", 1, 2, "tenant-a"),
    ("cd", "m", (1 << 63) - 1, 0, ""),
    ("ef", "m", -(1 << 63), 0, ""),
    ("10", "m", -1, (1 << 63) - 1, "\u00e9" * 128),
]


@pytest.mark.parametrize("key", LMCACHE_EDGE_KEYS)
def test_lmcache_index_name_and_key_are_the_c_functions(key: tuple) -> None:
    """lmcache_index_name and lmcache_index_key return what the C calls return (the
    coordinator's own code, which tests/capi_lmcache_key_test.cc checks against what the
    coordinator publishes), and the key is key_from_name over the name in the tenant's
    namespace."""
    lib = _lib.load()
    c_key = _lib.LmcacheKeyC(key[0].encode(), key[1].encode(), key[2], key[3], key[4].encode())
    needed = ctypes.c_size_t(0)
    assert lib.cxlkv_lmcache_index_name(ctypes.byref(c_key), None, 0, ctypes.byref(needed)) == 0
    buf = ctypes.create_string_buffer(needed.value)
    assert lib.cxlkv_lmcache_index_name(ctypes.byref(c_key), buf, needed.value, None) == 0
    name = cxlkv.lmcache_index_name(*key)
    assert name == buf.raw[:-1]
    assert name == "\x1f".join([key[0], key[1], str(key[2]), str(key[3]), key[4]]).encode()
    for tenant, layout in (("t", "L1"), ("", ""), ("\u00fc-tenant", "layout-\u03bb")):
        out = _lib.PrefixKeyC()
        ns = ctypes.c_uint64(0)
        assert lib.cxlkv_lmcache_index_key(tenant.encode(), layout.encode(), ctypes.byref(c_key),
                                           ctypes.byref(ns), ctypes.byref(out)) == 0
        k = cxlkv.lmcache_index_key(tenant, layout, *key)
        assert (k.lo, k.hi) == (out.lo, out.hi)
        assert ns.value == cxlkv.Namespace(tenant, "lmcache", layout).id
        assert k == cxlkv.key_from_name(ns.value, name)


def test_lmcache_index_key_golden_value() -> None:
    """The frozen format end to end, pinned to the value tests/capi_lmcache_key_test.cc pins."""
    k = cxlkv.lmcache_index_key("t", "L1", "00ff", "llama", 3, 1, "salt")
    assert (k.lo, k.hi) == (LMCACHE_GOLDEN_LO, LMCACHE_GOLDEN_HI)
    assert cxlkv.Namespace("t", "lmcache", "L1").id == LMCACHE_GOLDEN_NS
    assert cxlkv.lmcache_index_name("abcd", "m", 0) == b"abcd\x1fm\x1f0\x1f0\x1f"


@pytest.mark.parametrize("args, field", [
    (("00FF", "m", 0), "chunk_hash_hex"),
    (("0ff", "m", 0), "chunk_hash_hex"),
    (("00", "a@b", 0), "model_name"),
    (("00", "m", 0, -1), "object_group_id"),
    (("00", "m", 0, 0, "a/b"), "cache_salt"),
    (("00", "m", 0, 0, "s" * 129), "cache_salt"),
    (("00", "m\0x", 0), "model_name"),
    (("00", "m", 1 << 63), "kv_rank"),
    (("00", "m", "three"), "kv_rank"),
    ((b"00", "m", 0), "chunk_hash_hex"),
])
def test_lmcache_keys_lmcache_refuses_name_their_field(args: tuple, field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        cxlkv.lmcache_index_name(*args)
    with pytest.raises(InvalidArgumentError, match=field):
        cxlkv.lmcache_index_key("t", "L1", *args)


def test_lmcache_index_key_names_a_bad_tenant_or_layout() -> None:
    with pytest.raises(InvalidArgumentError, match="tenant"):
        cxlkv.lmcache_index_key(None, "L1", "00", "m", 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="layout_id"):
        cxlkv.lmcache_index_key("t", "L\0", "00", "m", 0)
