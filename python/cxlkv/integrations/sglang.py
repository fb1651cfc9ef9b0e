"""cxlkv as an SGLang HiCache storage backend (L3), over :class:`cxlkv.PageStore`.

Pinned to SGLang 0.5.x (:data:`cxlkv.integrations.TARGETS` ``["sglang"]``). Load it as a
dynamic backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "cxlkv",
        "module_path": "cxlkv.integrations.sglang", "class_name": "CxlkvHiCacheStorage",
        "domain": "file:/dev/shm/cxlkv-domain", "host_id": 1, "pool": "file:/dev/shm/cxlkv-pool"}'

(see :mod:`cxlkv.integrations._config` for every key). Each TP/PP/CP rank is its own host of
the domain (give each a distinct ``host_id``), and its pages live in a namespace of
(tenant, model, rank layout, page bytes), so ranks and models never mix.

What this class adds to the store: SGLang's constructor and config, the namespace built from
``HiCacheStorageConfig``, the page size taken from the host pool when it is registered, and the
version pin. Importing this module without SGLang works; :data:`CxlkvHiCacheStorage` is then
``None`` and :data:`IMPORT_ERROR` says why.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from ..keys import Namespace
from ..page_store import PageStore
from . import check_engine_version
from ._config import Attachment, as_dict

IMPORT_ERROR: Optional[BaseException] = None
ENGINE_VERSION: Optional[str] = None
try:
    import sglang as _sglang
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base

    ENGINE_VERSION = getattr(_sglang, "__version__", None)
except ImportError as e:  # SGLang is not installed here
    _Base = None
    IMPORT_ERROR = e


def namespace_for(storage_config: Any, tenant: str, page_bytes: int) -> Namespace:
    """The namespace of one SGLang rank's pages: what changes their bytes."""
    g = lambda name, default=None: getattr(storage_config, name, default)  # noqa: E731
    model = str(g("model_name") or "")
    layout = (f"sglang page_bytes={page_bytes} mla={bool(g('is_mla_model'))} "
              f"page_first={bool(g('is_page_first_layout'))} "
              f"tp={g('tp_rank', 0)}/{g('tp_size', 1)} pp={g('pp_rank', 0)}/{g('pp_size', 1)} "
              f"cp={g('attn_cp_rank', 0)}/{g('attn_cp_size', 1)}")
    return Namespace(tenant, model, layout)


if _Base is not None:

    class CxlkvHiCacheStorage(_Base):  # type: ignore[misc,valid-type]
        """SGLang ``HiCacheStorage`` backed by a CXL domain (see the module docstring)."""

        def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
            cfg = as_dict(getattr(storage_config, "extra_config", None))
            cfg.update(as_dict(kwargs))
            check_engine_version("sglang", ENGINE_VERSION,
                                 allow_untested=bool(cfg.get("allow_untested_version")))
            self.storage_config = storage_config
            self._att = Attachment(cfg, "CxlkvHiCacheStorage")
            self._store: Optional[PageStore] = None

        # The store is made when the host pool is known: its page size is the store's.
        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            super().register_mem_pool_host(mem_pool_host)
            ps = int(mem_pool_host.page_size)
            _, sizes = mem_pool_host.get_page_buffer_meta(np.arange(ps, dtype=np.int64))
            page_bytes = int(sum(sizes))
            ns = namespace_for(self.storage_config, self._att.tenant, page_bytes)
            self._store = PageStore(self._att.domain, ns, page_bytes=page_bytes)
            self._store.register_mem_pool_host(mem_pool_host)

        @property
        def store(self) -> PageStore:
            if self._store is None:
                from ..errors import InvalidArgumentError

                raise InvalidArgumentError(
                    "no host pool registered yet", operation="CxlkvHiCacheStorage",
                    hint="SGLang calls register_mem_pool_host before any transfer")
            return self._store

        def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
            return self.store.batch_exists(keys, extra_info)

        def exists(self, key: str) -> bool:
            return self.store.exists(key)

        def batch_get_v1(self, keys: List[str], host_indices: Any,
                         extra_info: Any = None) -> List[bool]:
            return self.store.batch_get_v1(keys, host_indices, extra_info)

        def batch_set_v1(self, keys: List[str], host_indices: Any,
                         extra_info: Any = None) -> List[bool]:
            return self.store.batch_set_v1(keys, host_indices, extra_info)

        def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
            return self.store.get(key, target_location, target_sizes)

        def batch_get(self, keys: List[str], target_locations: Any = None,
                      target_sizes: Any = None) -> Any:
            return self.store.batch_get(keys, target_locations, target_sizes)

        def set(self, key: str, value: Any = None, target_location: Any = None,
                target_sizes: Any = None) -> bool:
            return self.store.set(key, value, target_location, target_sizes)

        def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                      target_sizes: Any = None) -> bool:
            return self.store.batch_set(keys, values, target_locations, target_sizes)

        def clear(self) -> None:
            """Not supported: published pages are shared with other hosts; the domain's owner
            reclaims them. Left as SGLang's no-op."""
            return None

        def close(self) -> None:
            if self._store is not None:
                self._store.close()
            self._att.close()

else:
    CxlkvHiCacheStorage = None  # type: ignore[assignment,misc]
