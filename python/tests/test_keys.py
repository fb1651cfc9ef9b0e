"""Namespaces and prefix keys: determinism across processes, chaining, engine digests."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

import cxlkv
from cxlkv.errors import InvalidArgumentError, KeyLengthError
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
    assert cxlkv.Namespace("pytest", "model-b", "layout-1").digest_key(d32) != k
    assert ns.digest_key(d32[:16]) != ns.digest_key(d32[:16] + bytes(16))
    # Never equal to the key of a token block with the same words.
    words = np.frombuffer(d32, dtype="<u4")
    assert ns.chain_key(words) != k
    assert ns.chain_key(np.r_[[0x44475354, 0, 32], words].astype(np.uint32)) == k


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
