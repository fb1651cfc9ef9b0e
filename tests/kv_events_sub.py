"""A KV-event subscriber for tests/kv_events_test.cc, on Debian's python3-zmq and
python3-msgpack (run with /usr/bin/python3).

Binds a SUB socket on a free loopback port (the orchestrator's PUB connects to it), writes
{"port": N} as the first line of OUT, then one JSON line per message received:
{"topic", "seq", "ts", "rank", "form", "events"}, each event decoded to a dict by vLLM's
documented field order (vllm/distributed/kv_events.py: BlockStored(block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...),
BlockRemoved(block_hashes, medium, ...), AllBlocksCleared()). A positional event is a list whose
first element is the type name; a map event names its type under "type". Block hashes that are
bytes are written as hex. Exits after DEADLINE_S seconds.

usage: kv_events_sub.py OUT TOPIC DEADLINE_S
"""

import json
import sys
import time

import msgpack
import zmq

FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window"],
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}


def plain(v):
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, list):
        return [plain(x) for x in v]
    return v


def decode_event(e):
    if isinstance(e, list):
        tag, values = e[0], e[1:]
        names = FIELDS[tag]
        if len(values) > len(names):
            raise ValueError(f"{tag} has {len(values)} fields, vLLM documents {len(names)}")
        out = {"type": tag, "_positional": len(values)}
        out.update({n: plain(v) for n, v in zip(names, values)})
        return "array", out
    if isinstance(e, dict):
        tag = e["type"]
        unknown = set(e) - {"type"} - set(FIELDS[tag])
        if unknown:
            raise ValueError(f"{tag} has fields vLLM does not document: {sorted(unknown)}")
        return "map", {k: plain(v) for k, v in e.items()}
    raise ValueError(f"an event is neither an array nor a map: {e!r}")


def main():
    out_path, topic, deadline_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    with open(out_path, "w", buffering=1) as out:
        out.write(json.dumps({"port": port}) + "\n")
        end = time.time() + deadline_s
        while time.time() < end:
            if not sub.poll(100):
                continue
            frames = sub.recv_multipart()
            if len(frames) != 3:
                out.write(json.dumps({"error": f"{len(frames)} frames"}) + "\n")
                continue
            t, seq, payload = frames
            batch = msgpack.unpackb(payload, raw=False)
            if not isinstance(batch, list) or len(batch) != 3:
                out.write(json.dumps({"error": f"EventBatch is not [ts, events, rank]: {batch!r}"})
                          + "\n")
                continue
            ts, events, rank = batch
            forms, decoded = set(), []
            try:
                for e in events:
                    form, d = decode_event(e)
                    forms.add(form)
                    decoded.append(d)
            except (ValueError, KeyError) as err:
                out.write(json.dumps({"error": str(err)}) + "\n")
                continue
            out.write(json.dumps({"topic": t.decode(), "seq": int.from_bytes(seq, "big"),
                                  "ts": ts, "rank": rank, "form": sorted(forms),
                                  "events": decoded}) + "\n")


if __name__ == "__main__":
    main()
