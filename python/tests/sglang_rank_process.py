"""One SGLang 0.5.3 rank in a process of its own, as the engine runs each (dp, pp, tp) rank:
its scheduler process builds the backend through the dynamic loader with the config that
release gives (``sglang_interfaces.HiCacheStorageConfig053``: no DP or PP rank), registers its
host pool (which holds the stage's layers), then stores pages or reads them.

Run by test_sglang_contract.py: ``python3 sglang_rank_process.py '<json>'``; prints one JSON line
(the host row joined, the namespace, what it read) and holds its host row until its stdin
closes. Test-only.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
# SGLang hands host indices as torch tensors; numpy ones take the same path through the
# backend, and a process that does not import torch starts in a tenth of the time.
sys.modules.setdefault("torch", None)  # type: ignore[arg-type]

import numpy as np  # noqa: E402

from cxlkv.integrations import sglang as adapter  # noqa: E402
from cxlkv.page_store import HostPagePool  # noqa: E402
import sglang_interfaces as S  # noqa: E402

PAGE, TOKENS, TOKEN_BYTES = 16, 64, 64
PAGE_BYTES = 2 * PAGE * TOKEN_BYTES

#: The backend classes over SGLang 0.5.3 and 0.5.6 (the extra config's module_path /
#: class_name name one).
Backend053 = adapter.build_backend_class(S.HiCacheStorage, "0.5.3")
Backend056 = adapter.build_backend_class(S.HiCacheStorage, "0.5.6")


class StagePool(HostPagePool):
    """A host pool holding one PP stage's layers, as SGLang's HostKVCache says of itself
    (start_layer and the inclusive end_layer of its device pool)."""

    def __init__(self, data: Any, page_size: int, start_layer: int, end_layer: int) -> None:
        super().__init__(data, page_size, kv_parts=2)
        self.start_layer, self.end_layer = start_layer, end_layer


def stage_pages(pp_rank: int, n: int) -> list:
    """The bytes stage `pp_rank` computes for the test's pages (its layers' K and V)."""
    rng = np.random.default_rng(1000 + pp_rank)
    return [rng.integers(0, 256, PAGE_BYTES, np.uint8) for _ in range(n)]


def host_indices(n: int) -> np.ndarray:
    return np.arange(n * PAGE, dtype=np.int64)


def main() -> None:
    a = json.loads(sys.argv[1])
    cfg = S.HiCacheStorageConfig053(**a["config"])
    b = S.create_dynamic_backend(cfg)
    data = np.zeros((2, TOKENS, TOKEN_BYTES), np.uint8)
    b.register_mem_pool_host(StagePool(data, PAGE, a["start_layer"], a["end_layer"]))
    keys = a["keys"]
    n = len(keys)
    v1 = b.core.path == "v1"  # 0.5.6 with interface_v1: pages by host indices
    out: dict = {"host_id": b.core.host_id, "namespace": str(b.store.namespace),
                 "path": b.core.path}
    if a["do"] == "store":
        pages = stage_pages(a["pp_rank"], n)
        if v1:  # the stage's bytes in the host pool (K half, V half), stored from there
            for i, p in enumerate(pages):
                data[:, i * PAGE:(i + 1) * PAGE] = p.reshape(2, PAGE, TOKEN_BYTES)
            out["stored"] = all(b.batch_set_v1(keys, host_indices(n)))
        else:
            out["stored"] = b.batch_set(keys, pages)
        end = time.monotonic() + 5
        while b.batch_exists(keys) < n and time.monotonic() < end:
            time.sleep(0.002)
    else:  # read what another replica of this stage stored
        end = time.monotonic() + 5
        while b.batch_exists(keys) < n and time.monotonic() < end:
            time.sleep(0.002)
        if v1:
            ok = b.batch_get_v1(keys, host_indices(n))
            got = [data[:, i * PAGE:(i + 1) * PAGE].copy() if g else None
                   for i, g in enumerate(ok)]
        else:
            got = b.batch_get(keys, [np.zeros(PAGE_BYTES, np.uint8) for _ in keys])
        out["read"] = [None if g is None else hashlib.sha256(g.tobytes()).hexdigest()
                       for g in got]
    print(json.dumps(out), flush=True)
    sys.stdin.read()  # hold the host row until the test is done
    b.close()


if __name__ == "__main__":
    main()
