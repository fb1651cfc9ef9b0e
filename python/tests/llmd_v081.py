"""What a released llm-d KV-cache indexer does with a KV event message, stated as facts.

Transcribed (facts, no code copied) from llm-d/llm-d-kv-cache at tag v0.8.1, commit
0030c3ba64e13a0894d8e1b105a266039a24e756 (the latest release tag of the repository's stored
snapshot; read with `git show v0.8.1:<file>`). Every rule below names its file:line there.
A test fixture only: it states an upstream interface so that tests can decode cxlkv's frames
by it; nothing in the package depends on it.

Abstracted, and said where: the request-key hash (only what it depends on is kept) and the
LRU bounds of the index.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

import msgpack

REPO = "llm-d/llm-d-kv-cache"
TAG = "v0.8.1"
COMMIT = "0030c3ba64e13a0894d8e1b105a266039a24e756"

#: pkg/kvevents/pool.go:81 (DefaultConfig): the subscription filter, a ZMQ prefix match.
TOPIC_FILTER = "kv@"
#: pkg/kvevents/pool.go:32: the tier of an event without a medium.
DEFAULT_TIER = "gpu"
#: pkg/kvcache/backend.go:26-31 (DefaultKVCacheBackendConfig).
DEFAULT_WEIGHTS = {"gpu": 1.0, "cpu": 0.8}
#: pkg/kvcache/kvblock/token_processor.go:32 (defaultBlockSize).
BLOCK_SIZE = 16


class DecodeError(Exception):
    """The message is dropped: pkg/kvevents/pool.go:200-204 logs and returns."""


def parse_topic(topic: str) -> Tuple[str, str]:
    """pkg/kvevents/engineadapter/common.go:39-45: split on '@'; exactly three parts give
    (pod, model) = parts 1 and 2; otherwise the whole topic is the pod and the model is ""."""
    parts = topic.split("@")
    if len(parts) == 3:
        return parts[1], parts[2]
    return topic, ""


def hash_u64(raw: Any) -> int:
    """common.go:50-71: an integer as is; bytes: the last 8, big-endian (shorter: left-padded);
    empty bytes or another type is an error."""
    if isinstance(raw, int):
        return raw & (2**64 - 1)
    if isinstance(raw, (bytes, bytearray)):
        if not raw:
            raise DecodeError("hash byte slice is empty")
        return int.from_bytes(bytes(raw[-8:]).rjust(8, b"\0"), "big")
    raise DecodeError(f"unsupported hash type {type(raw).__name__}")


def decode(payload: bytes) -> List[Dict[str, Any]]:
    """The events of one payload, as the vLLM adapter reads them.

    pkg/kvevents/engineadapter/vllm_adapter.go:91-96: the batch is an array [ts, events,
    rank?]; :101-122: each event is decoded into an array whose element 0 is a string tag among
    BlockStored / BlockRemoved / AllBlocksCleared (a map, or another tag, fails: the whole
    message is dropped, :73-77); :147-233 BlockStored positions [1] block_hashes (array),
    [2] parent (nil or hash), [3] token_ids (array), [4] block_size (ignored), [5] lora_id,
    [6] medium, [7] lora_name, [8] extra_keys, at least 5 elements; :241-268 BlockRemoved
    [1] block_hashes, [2] medium."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise DecodeError("failed to decode vLLM event batch")
    out = []
    for ev in batch[1]:
        if not isinstance(ev, list):
            raise DecodeError(f"failed to decode tagged union: {type(ev).__name__}")
        if not ev or not isinstance(ev[0], str):
            raise DecodeError("malformed tagged union")
        tag = ev[0]
        at = (lambda i: ev[i] if i < len(ev) else None)  # noqa: E731 (fieldAt, :125-130)
        if tag == "BlockStored":
            if len(ev) < 5 or not isinstance(ev[1], list) or not isinstance(ev[3], list):
                raise DecodeError("BlockStored: malformed")
            out.append({"type": tag, "hashes": [hash_u64(h) for h in ev[1]],
                        "parent": hash_u64(ev[2]) if ev[2] is not None else 0,
                        "tokens": list(ev[3]), "medium": at(6), "lora_name": at(7)})
        elif tag == "BlockRemoved":
            if len(ev) < 2 or not isinstance(ev[1], list):
                raise DecodeError("BlockRemoved: malformed")
            out.append({"type": tag, "hashes": [hash_u64(h) for h in ev[1]],
                        "medium": at(2)})
        elif tag == "AllBlocksCleared":
            out.append({"type": tag})
        else:
            raise DecodeError(f"unknown vLLM event tag: {tag}")
    return out


def request_keys(parent: Any, tokens: List[int], model: str) -> List[Any]:
    """pkg/kvcache/kvblock/token_processor.go:184-197: full blocks of BLOCK_SIZE tokens only
    (a partial block is dropped); each key chains on the previous (the parent's for the first)
    and on the model name (:132-176). The hash itself is abstracted to a tuple of what it
    depends on."""
    keys = []
    prev = parent if parent is not None else ("root", model)
    for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        prev = ("rk", prev, tuple(tokens[i:i + BLOCK_SIZE]))
        keys.append(prev)
    return keys


class Indexer:
    """The in-memory index fed by the event pool (LRU bounds abstracted away)."""

    def __init__(self, weights: Optional[Dict[str, float]] = None) -> None:
        self.weights = DEFAULT_WEIGHTS if weights is None else weights
        self.data: Dict[Any, Set[Tuple[str, str]]] = {}  # request key -> {(pod, tier)}
        # pkg/kvcache/kvblock/in_memory.go:85-86: one engine -> request key map for all pods.
        self.engine_to_request: Dict[int, List[Any]] = {}
        self.dropped = 0

    def feed(self, topic: str, seq: bytes, payload: bytes) -> bool:
        """One ZMQ message; False when it is not received or is dropped."""
        # pkg/kvevents/zmq_subscriber.go:105 (the filter), :121-133 (3 frames, 8-byte seq).
        if not topic.startswith(TOPIC_FILTER) or len(seq) < 8:
            return False
        pod, model = parse_topic(topic)
        try:
            events = decode(payload)
        except DecodeError:
            self.dropped += 1
            return False
        for ev in events:
            self._apply(ev, pod, model)
        return True

    def _add(self, engine_keys: Optional[List[int]], rks: List[Any], entry: Tuple[str, str]):
        # in_memory.go:169-180: engine -> request mapping by the ratio of the lengths.
        if engine_keys:
            n = max(len(engine_keys), len(rks))
            new: Dict[int, List[Any]] = {}
            for i in range(n):
                new.setdefault(engine_keys[i * len(engine_keys) // n], []).append(
                    rks[i * len(rks) // n])
            self.engine_to_request.update(new)
        for rk in rks:  # :188-...
            self.data.setdefault(rk, set()).add(entry)

    def _apply(self, ev: Dict[str, Any], pod: str, model: str) -> None:
        # pkg/kvevents/pool.go:302-401 (BlockStored), :403-423 (BlockRemoved).
        tier = ev.get("medium").lower() if ev.get("medium") else DEFAULT_TIER  # :304-307
        entry = (pod, tier)
        if ev["type"] == "BlockStored":
            eff_model = ev["lora_name"] or model  # :310-313
            parent_rk = None
            if ev["parent"] != 0:  # :323-333: an unknown parent skips the event
                rks = self.engine_to_request.get(ev["parent"])
                if not rks:
                    return
                parent_rk = rks[-1]  # in_memory.go:318-324 (the last request key)
            rks = request_keys(parent_rk, ev["tokens"], eff_model)
            if not rks:
                # :390-393 -> :255-289: only with no tokens at all: resolve each engine key
                # already mapped (by any pod's event) and add this pod's entry there.
                if ev["tokens"] or not ev["hashes"]:
                    return
                resolved = [self.engine_to_request[h][-1] for h in ev["hashes"]
                            if self.engine_to_request.get(h)]
                if resolved:
                    self._add(None, list(dict.fromkeys(resolved)), entry)
                return
            self._add(ev["hashes"], rks, entry)
        elif ev["type"] == "BlockRemoved":
            for h in ev["hashes"]:  # in_memory.go:245-267 (Evict by engine key)
                rks = self.engine_to_request.get(h)
                if not rks:
                    continue
                for rk in rks:  # :279-313
                    pods = self.data.get(rk)
                    if pods is not None:
                        pods.discard(entry)
                        if not pods:
                            del self.data[rk]
                if all(rk not in self.data for rk in rks):
                    del self.engine_to_request[h]
        # AllBlocksCleared: logged only (pool.go:425-429).

    def score(self, tokens: List[int], model: str) -> Dict[str, float]:
        """pkg/kvcache/kvblock_scorer.go:106-154 (longest consecutive prefix, summing per key
        the pod's largest weight among its tiers, :91-103, where a tier not configured weighs
        1.0, :93-97)."""
        keys = request_keys(None, tokens, model)
        scores: Dict[str, float] = {}
        active: Optional[Set[str]] = None
        for rk in keys:
            cur: Dict[str, float] = {}
            for pod, tier in self.data.get(rk, ()):
                w = self.weights.get(tier, 1.0)
                cur[pod] = max(cur.get(pod, w), w)
            if active is None:
                active = set(cur)
                scores.update(cur)
            else:
                for pod in list(active):
                    if pod in cur:
                        scores[pod] += cur[pod]
                    else:
                        active.discard(pod)
            if not active:
                break
        return scores
