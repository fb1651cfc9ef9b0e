"""Router credit for the domain: one block the cxlkv tier stored credits every worker.

A block in a cxlkv domain is loadable by every engine attached to the domain, but a router
learns of it only from the KV events of the one engine that stored it (the vLLM tier's events,
``enable_kv_events``: ``BlockStored`` under the engine's own block hashes, parent and tokens,
with the tier's medium). Released llm-d (v0.8.1) files an event under the pod named in its
topic, ``kv@<pod>@<model>``, and nothing else: the pod segment is the only identity, so the
other workers of the domain get no credit. Its unreleased ``pool:<name>`` identity
(llm-d-router PR #2586) would let one event credit a pool; until a release has it, the emitter
fans out one event per worker (docs/kv_events.md, "Router credit for the domain").

:class:`DomainCredit` is that fan-out, as a pure function of the engines' messages:

- it takes each message an engine of the domain publishes (the three ZMQ frames' topic and
  payload, vLLM's ``EventBatch``, with events as positional arrays or as maps);
- it keeps the ``BlockStored`` and ``BlockRemoved`` events whose ``medium`` is the cxlkv tier's
  (``medium``, ``"STORAGE"`` by default: the engine's CPU primary tier also says ``"CPU"``, and
  its blocks are loadable only by that engine, so the tier must declare a medium of its own);
- it republishes them, unchanged but always as positional arrays (the only form llm-d v0.8.1
  decodes), under ``kv@<worker>@<model>`` for every other worker of the domain, the model taken
  from the source's topic (llm-d computes its request keys with it); a worker it learns of
  late (configured, or first seen publishing) first gets the blocks still held;
- a worker learnt from its messages departs when it has published nothing for
  ``worker_idle_s`` (its pod gone, or idle: an engine that publishes again is a late worker
  and gets the blocks still held first), or when :meth:`DomainCredit.remove_worker` names it;
  nothing is published for a departed worker. Configured workers stay until removed;
- with ``pool`` set it instead publishes once, under ``kv@pool:<pool>@<model>``, the identity
  of PR #2586: off by default, because a released llm-d reads ``pool:<pool>`` as one more pod
  and credits no real endpoint.

:func:`run` moves the messages: a SUB socket on every engine's KV event endpoint (filter
``kv@``) and a PUB socket on the router's (an endpoint with a wildcard, ``tcp://*:PORT``, binds;
any other connects), as ``python -m cxlkv.integrations.router_credit``. It needs Debian's
``python3-zmq`` and ``python3-msgpack``; :class:`DomainCredit` needs only ``msgpack``.

Thread-safety: a :class:`DomainCredit` is used by one thread.
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..errors import InvalidArgumentError

log = logging.getLogger(__name__)

#: The topic prefix llm-d subscribes to by default, and the form of its topics.
TOPIC_PREFIX = "kv@"

#: vLLM's ``BlockStored`` fields after the tag, in its order, as far as llm-d v0.8.1 reads them
#: (docs/kv_events.md, "The wire format"); later fields of the map form are left out.
BLOCK_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                       "lora_id", "medium", "lora_name", "extra_keys")
BLOCK_REMOVED_FIELDS = ("block_hashes", "medium")
_FIELDS = {"BlockStored": BLOCK_STORED_FIELDS, "BlockRemoved": BLOCK_REMOVED_FIELDS}
_MEDIUM_AT = {"BlockStored": 6, "BlockRemoved": 2}  # the medium's place, the tag at 0

#: Mediums that are never the cxlkv tier's: the device, and vLLM's CPU primary tier, whose
#: blocks only the engine holding them can load.
ENGINE_LOCAL_MEDIUMS = ("GPU", "CPU")


def _msgpack() -> Any:
    try:
        import msgpack  # type: ignore[import-not-found]
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise InvalidArgumentError(
            f"router credit needs msgpack ({e})", subject="cxlkv.integrations.router_credit",
            hint="apt-get install python3-msgpack, or pip install msgpack") from None
    return msgpack


def parse_topic(topic: str) -> Tuple[str, str]:
    """(pod, model) from ``kv@<pod>@<model>``; InvalidArgumentError naming the topic else."""
    parts = topic.split("@")
    if len(parts) != 3 or parts[0] != "kv" or not parts[1] or not parts[2]:
        raise InvalidArgumentError(
            f"topic {topic!r} is not kv@<pod>@<model>", subject="router credit",
            hint="set the engine's kv_events_config topic to kv@<pod>@<model> (the form llm-d "
                 "reads the pod and model from)")
    return parts[1], parts[2]


def _positional(event: Any) -> List[Any]:
    """An event as vLLM's positional array: [tag, fields...]; the map form is converted."""
    if isinstance(event, (list, tuple)):
        return list(event)
    if isinstance(event, dict):
        tag = event.get("type")
        fields = _FIELDS.get(tag, ())
        out = [tag] + [event.get(f) for f in fields]
        while len(out) > 1 and out[-1] is None:
            out.pop()  # as vLLM's encoder omits trailing defaults
        return out
    raise InvalidArgumentError(f"an event of type {type(event).__name__}",
                               subject="router credit", hint="events are arrays or maps")


class _Held:
    """A BlockStored the fan-out relayed, kept to replay to a worker that joins later."""

    __slots__ = ("source", "model", "event", "removed")

    def __init__(self, source: str, model: str, event: List[Any]) -> None:
        self.source = source
        self.model = model
        self.event = event
        self.removed: Set[Any] = set()


class DomainCredit:
    """Fans the cxlkv tier's events out to every worker of the domain (module docstring).

    Args:
        workers: the pod names (the ``<pod>`` of their topics) of the domain's engines known
            in advance; engines seen publishing are added.
        medium: the cxlkv tier's medium, exactly as its events carry it (the tier's ``medium``
            key). ``GPU`` and ``CPU`` are refused: they are the engine's own tiers' too.
        pool: publish once under ``kv@pool:<pool>@<model>`` instead of once per worker.
        max_held: how many relayed ``BlockStored`` events are kept for late workers (the
            oldest go first; a worker that joins later misses those).
        worker_idle_s: a worker learnt from its messages departs after this long without
            one (None: never). Configured workers stay until :meth:`remove_worker`.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, workers: Iterable[str] = (), *, medium: str = "STORAGE",
                 pool: Optional[str] = None, max_held: int = 100_000,
                 worker_idle_s: Optional[float] = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not medium or medium in ENGINE_LOCAL_MEDIUMS:
            raise InvalidArgumentError(
                f"medium {medium!r} is also the medium of the engine's own tiers, whose blocks "
                "only that engine can load", subject="router credit",
                hint="declare the cxlkv tier with medium STORAGE (its vLLM config key "
                     "'medium') and relay STORAGE")
        if worker_idle_s is not None and not worker_idle_s > 0:
            raise InvalidArgumentError(f"worker_idle_s {worker_idle_s!r} is not positive",
                                       subject="router credit",
                                       hint="seconds a learnt worker may stay silent, or None "
                                            "to keep every worker")
        if pool is not None and ("@" in pool or not pool):
            raise InvalidArgumentError(f"pool {pool!r} is empty or contains '@'",
                                       subject="router credit",
                                       hint="name the pool as the domain is named")
        self.medium = medium
        self.pool = pool
        self.max_held = max_held
        self.worker_idle_s = worker_idle_s
        self._clock = clock
        self.workers: List[str] = []
        self._configured: Set[str] = set()
        self._last_seen: Dict[str, float] = {}  # learnt workers: their last message
        self._msgpack = _msgpack()
        self._held: "collections.OrderedDict[int, _Held]" = collections.OrderedDict()
        self._by_hash: Dict[Any, Set[int]] = {}
        self._next_id = 0
        for w in workers:
            self.add_worker(w)

    # -- workers ----------------------------------------------------------------------------

    def add_worker(self, pod: str) -> List[Tuple[str, bytes]]:
        """Adds a configured worker (it stays until :meth:`remove_worker`); returns the
        messages that credit it with the blocks still held (to publish before anything else
        for it). Nothing for a worker already known."""
        out = self._add(pod)
        self._configured.add(pod)
        self._last_seen.pop(pod, None)
        return out

    def remove_worker(self, pod: str) -> bool:
        """The worker departs: nothing more is published for it. False if it was not known."""
        if pod not in self.workers:
            return False
        self.workers.remove(pod)
        self._configured.discard(pod)
        self._last_seen.pop(pod, None)
        return True

    def expire(self, now: Optional[float] = None) -> List[str]:
        """Removes the learnt workers silent for longer than ``worker_idle_s``; returns them.
        :meth:`handle` calls it, and :func:`run` between messages."""
        if self.worker_idle_s is None:
            return []
        now = self._clock() if now is None else now
        gone = [w for w, t in self._last_seen.items() if now - t > self.worker_idle_s]
        for w in gone:
            self.remove_worker(w)
            log.info("router credit: worker %r published nothing for %.0f s: departed "
                     "(a later message adds it again, with the blocks still held)",
                     w, self.worker_idle_s)
        return gone

    def _add(self, pod: str) -> List[Tuple[str, bytes]]:
        if not pod or "@" in pod:
            raise InvalidArgumentError(f"worker {pod!r} is empty or contains '@'",
                                       subject="router credit",
                                       hint="name workers as the <pod> of their topics")
        if pod in self.workers:
            return []
        self.workers.append(pod)
        if self.pool is not None:
            return []
        out: List[Tuple[str, bytes]] = []
        for h in self._held.values():
            if h.source == pod:
                continue
            events = [h.event]
            if h.removed:
                events.append(["BlockRemoved", sorted(h.removed, key=repr), self.medium])
            out.append((f"kv@{pod}@{h.model}", self._batch(time.time(), events, None)))
        return out

    # -- messages ---------------------------------------------------------------------------

    def handle(self, topic: Any, payload: bytes) -> List[Tuple[str, bytes]]:
        """The (topic, payload) messages to publish for one engine message, in order.

        Raises InvalidArgumentError naming the topic or payload when the message is not a vLLM
        KV event message; the caller logs it and goes on."""
        if isinstance(topic, (bytes, bytearray)):
            topic = bytes(topic).decode("utf-8", "replace")
        source, model = parse_topic(topic)
        now = self._clock()
        if source not in self._configured:
            self._last_seen[source] = now  # before expire: a worker that speaks stays
        self.expire(now)
        out = self._add(source)
        try:
            batch = self._msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several types
            raise InvalidArgumentError(f"payload from {topic!r} is not msgpack ({e})",
                                       subject="router credit",
                                       hint="point the relay at vLLM KV event endpoints") from None
        if not isinstance(batch, (list, tuple)) or len(batch) < 2:
            raise InvalidArgumentError(f"payload from {topic!r} is not [ts, events, rank]",
                                       subject="router credit",
                                       hint="point the relay at vLLM KV event endpoints")
        ts, events = batch[0], batch[1]
        if not isinstance(events, (list, tuple)):
            raise InvalidArgumentError(f"payload from {topic!r}: events are not a list",
                                       subject="router credit",
                                       hint="point the relay at vLLM KV event endpoints")
        rank = batch[2] if len(batch) > 2 else None
        mine = [e for e in (_positional(ev) for ev in events) if self._is_tier_event(e)]
        if not mine:
            return out
        for e in mine:
            self._remember(source, model, e)
        payload_out = self._batch(ts, mine, rank)
        if self.pool is not None:
            out.append((f"kv@pool:{self.pool}@{model}", payload_out))
        else:
            out.extend((f"kv@{w}@{model}", payload_out) for w in self.workers if w != source)
        return out

    def _is_tier_event(self, e: List[Any]) -> bool:
        at = _MEDIUM_AT.get(e[0] if e else None)
        return at is not None and len(e) > at and e[at] == self.medium

    def _remember(self, source: str, model: str, e: List[Any]) -> None:
        hashes = e[1] if isinstance(e[1], (list, tuple)) else []
        if e[0] == "BlockStored":
            hid = self._next_id
            self._next_id += 1
            self._held[hid] = _Held(source, model, e)
            for h in hashes:
                self._by_hash.setdefault(h, set()).add(hid)
            while len(self._held) > self.max_held:
                old_id, old = self._held.popitem(last=False)
                self._forget(old_id, old)
            return
        for h in hashes:  # BlockRemoved
            for hid in list(self._by_hash.get(h, ())):
                held = self._held.get(hid)
                if held is None:
                    continue
                held.removed.add(h)
                if len(held.removed) >= len(set(held.event[1])):
                    del self._held[hid]
                    self._forget(hid, held)

    def _forget(self, hid: int, held: _Held) -> None:
        for h in held.event[1]:
            ids = self._by_hash.get(h)
            if ids is not None:
                ids.discard(hid)
                if not ids:
                    del self._by_hash[h]

    def _batch(self, ts: Any, events: Sequence[List[Any]], rank: Any) -> bytes:
        return self._msgpack.packb([ts, list(events), rank], use_bin_type=True)

    @property
    def held(self) -> int:
        """How many relayed BlockStored events are kept for late workers."""
        return len(self._held)


def _bind(endpoint: str) -> bool:
    # A wildcard address binds; anything else connects: vLLM's publishers bind their endpoint
    # (tcp://*:5557, or ipc://), and llm-d's subscriber binds a local one
    # (zmq_subscriber.go:91-96 at v0.8.1), so the relay connects to both.
    return "*" in endpoint


def run(credit: DomainCredit, sources: Sequence[str], publish: str,
        stop: Optional[threading.Event] = None, context: Any = None) -> None:
    """Relays until ``stop`` is set: SUB from every source endpoint, PUB to ``publish``."""
    try:
        import zmq  # type: ignore[import-not-found]
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise InvalidArgumentError(
            f"the relay needs pyzmq ({e})", subject="router credit",
            hint="apt-get install python3-zmq, or pip install pyzmq") from None
    if not sources:
        raise InvalidArgumentError("no source endpoints", subject="router credit",
                                   hint="pass every engine's KV event endpoint (--source)")
    ctx = context or zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    pub = ctx.socket(zmq.PUB)
    seq = 0
    try:
        sub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX.encode())
        ends = [(s, sub, "--source") for s in sources] + [(publish, pub, "--publish")]
        for ep, sock, what in ends:
            try:
                (sock.bind if _bind(ep) else sock.connect)(ep)
            except zmq.ZMQError as e:
                raise InvalidArgumentError(
                    f"{what} {ep!r}: {e}", subject="router credit",
                    hint="tcp://HOST:PORT or ipc://PATH connects, tcp://*:PORT binds") from None

        def send(msgs: Iterable[Tuple[str, bytes]]) -> None:
            nonlocal seq
            for t, p in msgs:
                pub.send_multipart([t.encode(), seq.to_bytes(8, "big"), p])
                seq += 1

        while stop is None or not stop.is_set():
            if not sub.poll(100):
                credit.expire()
                continue
            frames = sub.recv_multipart()
            if len(frames) != 3:
                log.warning("router credit: a message of %d frames (want 3), skipped",
                            len(frames))
                continue
            try:
                send(credit.handle(frames[0], frames[2]))
            except InvalidArgumentError as e:
                log.warning("%s", e)
    finally:
        sub.close()
        pub.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m cxlkv.integrations.router_credit",
        description="Credit every worker of a cxlkv domain with the blocks its tier stored "
                    "(docs/kv_events.md, 'Router credit for the domain').")
    ap.add_argument("--source", action="append", default=[], required=True,
                    help="an engine's KV event endpoint (repeat for every engine)")
    ap.add_argument("--publish", required=True, help="the router's endpoint, e.g. "
                    "tcp://indexer:5557 (only a wildcard address binds)")
    ap.add_argument("--worker", action="append", default=[],
                    help="a worker's <pod> known in advance (repeatable)")
    ap.add_argument("--medium", default="STORAGE", help="the cxlkv tier's medium")
    ap.add_argument("--worker-idle-s", type=float, default=600.0,
                    help="a worker first seen publishing departs after this many seconds "
                         "without a message (0: never); --worker ones stay")
    ap.add_argument("--pool", default=None,
                    help="publish under kv@pool:<POOL>@<model> (llm-d-router PR #2586; no "
                         "released llm-d reads it)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        credit = DomainCredit(a.worker, medium=a.medium, pool=a.pool,
                              worker_idle_s=a.worker_idle_s or None)
        run(credit, a.source, a.publish)
    except InvalidArgumentError as e:
        print(e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
