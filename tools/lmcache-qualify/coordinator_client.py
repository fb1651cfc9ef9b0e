"""A client of LMCache's memory coordinator API, written from docs/lmcache.md ("The
coordinator"), over http.client only (no LMCache, no third-party package).

Used by lmcache_qualify.py, tests/lmcache/coordinator_http_test.py and
bench/lmcache_coordinator_bench.py. Every
call returns (status, body); the helpers raise CoordinatorError with the contract's error name
("stale_epoch", "invalid_reservation", "out_of_space") or the status.
"""

import http.client
import json
import secrets
import socket


class _Connection(http.client.HTTPConnection):
    """http.client sends a POST's headers and body in two writes: without TCP_NODELAY the body
    waits for the server's delayed ACK (about 40 ms a request)."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class CoordinatorError(Exception):
    def __init__(self, status, body):
        self.status = status
        self.body = body
        self.error = body.get("error", "") if isinstance(body, dict) else ""
        super().__init__(f"{status} {self.error} {body}")


def make_key(i, model="m", kv_rank=0, group=0, salt=""):
    """An EncodedObjectKey: chunk_hash_hex is lower-case hex of even length."""
    return {
        "chunk_hash_hex": f"{i:032x}",
        "model_name": model,
        "kv_rank": kv_rank,
        "object_group_id": group,
        "cache_salt": salt,
    }


def make_layout(nbytes, dtype="uint8"):
    """A one-tensor layout of nbytes (dtype uint8) or nbytes / itemsize elements."""
    size = {"uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    return {"shapes": [[nbytes // size]], "dtypes": [dtype]}


class Client:
    def __init__(self, port, token, host="127.0.0.1", timeout=10.0):
        self.host, self.port, self.token, self.timeout = host, port, token, timeout
        self.conn = _Connection(host, port, timeout=timeout)
        self.epoch = None

    def close(self):
        self.conn.close()

    def raw(self, method, path, body=None, headers=None, auth=True):
        """One request on the kept-alive connection; body is bytes, str or a JSON value."""
        h = {} if headers is None else dict(headers)
        if auth and self.token is not None:
            h["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else (
                body.encode() if isinstance(body, str) else json.dumps(body).encode())
            h["Content-Type"] = "application/json"
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=data, headers=h)
                r = self.conn.getresponse()
                text = r.read()
                break
            except (http.client.HTTPException, ConnectionError, OSError):
                # A kept-alive connection the server closed: once more on a new one.
                self.conn.close()
                self.conn = _Connection(self.host, self.port, timeout=self.timeout)
                if attempt == 1:
                    raise
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text.decode(errors="replace")
        return r.status, parsed

    def _ok(self, method, path, body=None):
        status, out = self.raw(method, path, body)
        if status != 200:
            raise CoordinatorError(status, out)
        return out

    def region(self):
        out = self._ok("GET", "/v1/region")
        self.epoch = out["region_epoch"]
        return out

    def status(self):
        return self._ok("GET", "/v1/status")

    def stats(self):
        return self._ok("GET", "/cxlkv/v1/stats")

    def reserve(self, items, epoch=None):
        """items: [(key, layout)]. Returns the grants (None for a key that exists)."""
        body = {"region_epoch": epoch or self.epoch,
                "items": [{"key": k, "layout": l} for k, l in items]}
        return self._ok("POST", "/v1/writes/reserve", body)["grants"]

    def finish(self, grants, epoch=None):
        body = {"region_epoch": epoch or self.epoch,
                "reservations": [{"key": g["key"], "token": g["token"]} for g in grants]}
        return self._ok("POST", "/v1/writes/finish", body)

    def abort(self, grants, epoch=None):
        body = {"region_epoch": epoch or self.epoch,
                "reservations": [{"key": g["key"], "token": g["token"]} for g in grants]}
        return self._ok("POST", "/v1/writes/abort", body)

    def lookup(self, keys, epoch=None):
        body = {"region_epoch": epoch or self.epoch, "keys": keys}
        return self._ok("POST", "/v1/lookup", body)["hits"]


def new_token():
    return secrets.token_hex(16)
