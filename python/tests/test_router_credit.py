"""Router credit for the domain (#41): one block the cxlkv tier stored credits every worker.

The router is llm-d's KV-cache indexer at its release v0.8.1 (tests/llmd_v081.py: its rules
transcribed as facts, with file:line at commit 0030c3ba64e1). vLLM's messages are built as its
publisher sends them (docs/kv_events.md, "The wire format"): three frames, a positional batch,
events as arrays, or as maps since vLLM PR #42892. Needs Debian's python3-msgpack (and
python3-zmq for the relay test).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid

import pytest

msgpack = pytest.importorskip("msgpack", reason="python3-msgpack is not installed")

import llmd_v081 as llmd  # noqa: E402

from cxlkv.errors import InvalidArgumentError  # noqa: E402
from cxlkv.integrations import router_credit  # noqa: E402
from cxlkv.integrations.router_credit import DomainCredit  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B"
TOKENS = list(range(100, 148))  # three blocks of 16
SEQ0 = (0).to_bytes(8, "big")
# vLLM's weights for llm-d as docs/kv_events.md recommends: the tier's STORAGE listed, as
# v0.8.1 weighs a tier it does not list at 1.0, the same as GPU (kvblock_scorer.go:93-97).
WEIGHTS = dict(llmd.DEFAULT_WEIGHTS, storage=0.8)


def engine_hashes(tokens, n):
    """Stand-ins for vLLM's block hashes (32 bytes each, chained)."""
    out, prev = [], b"seed"
    for i in range(n):
        prev = hashlib.sha256(prev + bytes(str(tokens[16 * i:16 * i + 16]), "ascii")).digest()
        out.append(prev)
    return out


def stored(hashes, tokens, medium, parent=None):
    return ["BlockStored", hashes, parent, tokens, 16, None, medium, None]


def batch(*events, ts=1.5):
    return msgpack.packb([ts, list(events), 0], use_bin_type=True)


def feed_all(index, msgs):
    for topic, payload in msgs:
        assert index.feed(topic, SEQ0, payload), topic


def test_a_tier_block_credits_every_worker_of_the_domain():
    hashes = engine_hashes(TOKENS, 3)
    engine_msg = ("kv@a@" + MODEL, batch(stored(hashes, TOKENS, "GPU"),
                                          stored(hashes, TOKENS, "STORAGE")))
    index = llmd.Indexer(WEIGHTS)
    index.feed(engine_msg[0], SEQ0, engine_msg[1])
    # What a router learnt before: only the engine that stored the block.
    assert index.score(TOKENS, MODEL) == {"a": 3.0}
    # The domain's own events (the orchestrator's: chain keys, no tokens) credit no one, under
    # its default topic or a kv@ one: chain keys are not engine keys (pool.go:255-289).
    domain = batch(["BlockStored", [b"\x01" * 16], None, [], 16, None, "SHARED", None])
    assert not index.feed("cxlkv/dom1", SEQ0, domain)
    assert index.feed("kv@dom1@" + MODEL, SEQ0, domain)
    assert index.score(TOKENS, MODEL) == {"a": 3.0}

    credit = DomainCredit(["a", "b", "c"])
    out = credit.handle(*engine_msg)
    assert [t for t, _ in out] == ["kv@b@" + MODEL, "kv@c@" + MODEL]
    feed_all(index, out)
    assert index.score(TOKENS, MODEL) == {"a": 3.0, "b": pytest.approx(2.4),
                                          "c": pytest.approx(2.4)}
    # Relayed events are the tier's only, positional, unchanged.
    (ev,) = msgpack.unpackb(out[0][1], raw=False)[1]
    assert ev == stored(hashes, TOKENS, "STORAGE")


def test_blocks_that_leave_the_domain_leave_every_worker():
    hashes = engine_hashes(TOKENS, 3)
    index = llmd.Indexer(WEIGHTS)
    credit = DomainCredit(["a", "b"])
    first = ("kv@a@" + MODEL, batch(stored(hashes, TOKENS, "GPU"),
                                     stored(hashes, TOKENS, "STORAGE")))
    index.feed(first[0], SEQ0, first[1])
    feed_all(index, credit.handle(*first))
    assert index.score(TOKENS, MODEL) == {"a": 3.0, "b": pytest.approx(2.4)}
    gone = ("kv@a@" + MODEL, batch(["BlockRemoved", hashes[1:], "STORAGE"]))
    index.feed(gone[0], SEQ0, gone[1])
    feed_all(index, credit.handle(*gone))
    assert index.score(TOKENS, MODEL) == {"a": 3.0, "b": pytest.approx(0.8)}
    assert credit.held == 1
    gone = ("kv@a@" + MODEL, batch(["BlockRemoved", hashes[:1], "STORAGE"]))
    feed_all(index, credit.handle(*gone))
    assert index.score(TOKENS, MODEL) == {"a": 3.0}
    assert credit.held == 0


def test_the_engines_own_tiers_are_not_relayed():
    hashes = engine_hashes(TOKENS, 3)
    credit = DomainCredit(["a", "b"])
    msg = batch(stored(hashes, TOKENS, "GPU"), stored(hashes, TOKENS, "CPU"),
                ["BlockRemoved", hashes, "CPU"], ["AllBlocksCleared"])
    assert credit.handle("kv@a@" + MODEL, msg) == []
    with pytest.raises(InvalidArgumentError, match="medium 'CPU'.*declare the cxlkv tier with "
                                                   "medium STORAGE"):
        DomainCredit(["a"], medium="CPU")


def test_map_form_events_reach_llmd_as_arrays():
    hashes = engine_hashes(TOKENS, 3)
    as_map = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
              "token_ids": TOKENS, "block_size": 16, "lora_id": None, "medium": "STORAGE",
              "lora_name": None, "group_idx": 0}
    payload = batch(as_map)
    index = llmd.Indexer(WEIGHTS)
    # v0.8.1 decodes each event as an array: a map-form message is dropped whole.
    assert not index.feed("kv@a@" + MODEL, SEQ0, payload) and index.dropped == 1
    out = DomainCredit(["a", "b"]).handle("kv@a@" + MODEL, payload)
    feed_all(index, out)
    assert index.score(TOKENS, MODEL) == {"b": pytest.approx(2.4)}


def test_a_worker_seen_later_gets_the_blocks_still_held():
    hashes = engine_hashes(TOKENS, 3)
    credit = DomainCredit()
    index = llmd.Indexer(WEIGHTS)
    msg = ("kv@a@" + MODEL, batch(stored(hashes, TOKENS, "GPU"),
                                   stored(hashes, TOKENS, "STORAGE")))
    index.feed(*msg[:1], SEQ0, msg[1])
    assert credit.handle(*msg) == []  # no other worker yet
    feed_all(index, credit.handle("kv@a@" + MODEL,
                                  batch(["BlockRemoved", hashes[2:], "STORAGE"])))
    out = credit.handle("kv@b@" + MODEL, batch(stored([b"\x07" * 32], [1] * 16, "GPU")))
    assert [t for t, _ in out] == ["kv@b@" + MODEL]
    feed_all(index, out)
    assert index.score(TOKENS, MODEL) == {"a": 3.0, "b": pytest.approx(1.6)}
    assert credit.workers == ["a", "b"]


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_a_departed_worker_is_published_nothing():
    hashes = engine_hashes(TOKENS, 3)
    clock = FakeClock()
    credit = DomainCredit(["a"], worker_idle_s=60, clock=clock)
    tier = lambda src: (f"kv@{src}@" + MODEL, batch(stored(hashes, TOKENS, "STORAGE")))  # noqa: E731
    credit.handle("kv@b@" + MODEL, batch(stored([b"\x07" * 32], [1] * 16, "GPU")))
    credit.handle("kv@c@" + MODEL, batch(stored([b"\x08" * 32], [2] * 16, "GPU")))
    assert credit.workers == ["a", "b", "c"]
    # b keeps publishing, c falls silent (its pod gone): past worker_idle_s c departs, and the
    # tier's blocks credit a and b only. a was configured: it stays though it never spoke.
    clock.t += 40
    credit.handle("kv@b@" + MODEL, batch(stored([b"\x09" * 32], [3] * 16, "GPU")))
    clock.t += 40
    out = credit.handle(*tier("b"))
    assert [t for t, _ in out] == ["kv@a@" + MODEL]
    assert credit.workers == ["a", "b"]
    # The relay's loop expires between messages too.
    clock.t += 61
    assert credit.expire() == ["b"]
    assert credit.handle(*tier("a")) == []  # no one else left
    # A departed worker that speaks again is a late worker: the blocks still held, first.
    out = credit.handle("kv@c@" + MODEL, batch(stored([b"\x08" * 32], [2] * 16, "GPU")))
    assert [t for t, _ in out] == ["kv@c@" + MODEL] * 2  # b's tier block, then a's
    index = llmd.Indexer(WEIGHTS)
    feed_all(index, out)
    assert index.score(TOKENS, MODEL) == {"c": pytest.approx(2.4)}
    # remove_worker: a configured worker departs only so.
    assert credit.remove_worker("a") and not credit.remove_worker("a")
    assert [t for t, _ in credit.handle(*tier("c"))] == []
    assert credit.workers == ["c"]


def test_worker_idle_s_must_be_positive():
    with pytest.raises(InvalidArgumentError, match="worker_idle_s"):
        DomainCredit(worker_idle_s=0)
    assert DomainCredit(worker_idle_s=None).expire(now=1e12) == []


def test_tier_events_without_tokens_credit_through_the_engine_keys():
    # vLLM fills token ids only where its event tracker saw the request; without them llm-d
    # adds the pod to the request keys the engine hashes already map to (pool.go:255-289),
    # mapped by the engine's GPU event, for every pod (in_memory.go:85-86).
    hashes = engine_hashes(TOKENS, 3)
    index = llmd.Indexer(WEIGHTS)
    gpu = batch(stored(hashes, TOKENS, "GPU"))
    index.feed("kv@a@" + MODEL, SEQ0, gpu)
    credit = DomainCredit(["a", "b"])
    assert credit.handle("kv@a@" + MODEL, gpu) == []
    tier = ("kv@a@" + MODEL, batch(stored(hashes, [], "STORAGE")))
    index.feed(tier[0], SEQ0, tier[1])
    feed_all(index, credit.handle(*tier))
    assert index.score(TOKENS, MODEL) == {"a": 3.0, "b": pytest.approx(2.4)}


def test_pool_identity_is_behind_a_setting():
    hashes = engine_hashes(TOKENS, 3)
    msg = ("kv@a@" + MODEL, batch(stored(hashes, TOKENS, "GPU"),
                                   stored(hashes, TOKENS, "STORAGE")))
    out = DomainCredit(["a", "b", "c"], pool="dom1").handle(*msg)
    assert [t for t, _ in out] == ["kv@pool:dom1@" + MODEL]
    # A released llm-d reads the pod segment as a pod (common.go:39-45): a phantom pod, no
    # real worker credited; hence off by default.
    index = llmd.Indexer(WEIGHTS)
    index.feed(msg[0], SEQ0, msg[1])
    feed_all(index, out)
    assert index.score(TOKENS, MODEL) == {"a": 3.0, "pool:dom1": pytest.approx(2.4)}
    with pytest.raises(InvalidArgumentError, match="pool 'x@y'"):
        DomainCredit(pool="x@y")


def test_a_topic_llmd_cannot_read_is_refused_with_the_fix():
    with pytest.raises(InvalidArgumentError,
                       match="'cxlkv/dom1' is not kv@<pod>@<model>.*kv_events_config topic"):
        DomainCredit(["a"]).handle("cxlkv/dom1", batch())


def test_an_endpoint_zmq_refuses_is_named():
    pytest.importorskip("zmq", reason="python3-zmq is not installed")
    with pytest.raises(InvalidArgumentError, match="--source 'bogus://x'.*tcp://HOST:PORT"):
        router_credit.run(DomainCredit(), ["bogus://x"], "ipc:///nonexistent/x")


def test_the_relay_over_zmq(tmp_path):
    zmq = pytest.importorskip("zmq", reason="python3-zmq is not installed")
    ctx = zmq.Context()
    tag = uuid.uuid4().hex[:8]
    src, dst = f"ipc://{tmp_path}/engine-{tag}", f"ipc://{tmp_path}/router-{tag}"
    engine = ctx.socket(zmq.PUB)
    engine.bind(src)
    router = ctx.socket(zmq.SUB)
    router.setsockopt(zmq.SUBSCRIBE, llmd.TOPIC_FILTER.encode())
    router.bind(dst)
    stop = threading.Event()
    relay = threading.Thread(target=router_credit.run,
                             args=(DomainCredit(["a", "b"]), [src], dst, stop, ctx))
    relay.start()
    hashes = engine_hashes(TOKENS, 3)
    payload = batch(stored(hashes, TOKENS, "GPU"), stored(hashes, TOKENS, "STORAGE"))
    index = llmd.Indexer(WEIGHTS)
    index.feed("kv@a@" + MODEL, SEQ0, payload)
    try:
        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:  # until both subscriptions hold
            engine.send_multipart([b"kv@a@" + MODEL.encode(), SEQ0, payload])
            if router.poll(200):
                got = router.recv_multipart()
        assert got is not None, "nothing relayed in 10 s"
        topic, seq, body = got
        assert topic == b"kv@b@" + MODEL.encode() and len(seq) == 8
        assert index.feed(topic.decode(), seq, body)
        assert index.score(TOKENS, MODEL) == {"a": 3.0, "b": pytest.approx(2.4)}
    finally:
        stop.set()
        relay.join(5)
        engine.close(0)
        router.close(0)
        ctx.term()
