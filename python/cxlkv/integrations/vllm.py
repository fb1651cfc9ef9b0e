"""cxlkv as a vLLM secondary offload tier, over :class:`cxlkv.OffloadTier`.

Pinned to vLLM 0.22.x (:data:`cxlkv.integrations.TARGETS` ``["vllm"]``), whose
``SecondaryTierManager`` takes ``(vllm_config, primary_kv_view)``, answers ``lookup`` with
True / False / None and reports jobs through ``get_finished``. Later releases reworked the
interface (``LookupResult``, ``get_finished_jobs``, ``drain_jobs``, a ``tier_type`` argument):
``python -m cxlkv.integrations.check`` reports the differences on an installed vLLM.

Configuration (``TieringOffloadingSpec``)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8000000000, "block_size": 16,
        "secondary_tiers": [{"type": "cxlkv", "domain": "file:/dev/shm/cxlkv-domain",
          "host_id": 1, "pool": "file:/dev/shm/cxlkv-pool", "block_bytes": 5242880}]}}'

``block_bytes`` is the primary tier's block size in bytes (it must divide the primary view).
Call :func:`register` in every vLLM process before the engine starts (for example from a
``vllm.general_plugins`` entry point) so the factory knows the ``cxlkv`` tier type. vLLM's
block hashes are the same on every host only with a fixed ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, List, Optional

from ..keys import Namespace
from ..offload_tier import OffloadTier, TierJob
from . import check_engine_version
from ._config import Attachment
from ..errors import EngineVersionError, InvalidArgumentError

TIER_TYPE = "cxlkv"
IMPORT_ERROR: Optional[BaseException] = None
ENGINE_VERSION: Optional[str] = None
try:
    import vllm as _vllm
    from vllm.v1.kv_offload.tiering.base import JobResult as _JobResult
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager as _Base

    ENGINE_VERSION = getattr(_vllm, "__version__", None)
except ImportError as e:  # vLLM is not installed here
    _Base = None
    _JobResult = None
    IMPORT_ERROR = e


if _Base is not None:

    class CxlkvSecondaryTier(_Base):  # type: ignore[misc,valid-type]
        """vLLM ``SecondaryTierManager`` backed by a CXL domain (see the module docstring)."""

        def __init__(self, vllm_config: Any, primary_kv_view: memoryview, **tier_kwargs: Any
                     ) -> None:
            check_engine_version("vllm", ENGINE_VERSION,
                                 allow_untested=bool(tier_kwargs.get("allow_untested_version")))
            super().__init__(vllm_config, primary_kv_view)
            if "block_bytes" not in tier_kwargs:
                raise InvalidArgumentError(
                    "the cxlkv tier's configuration lacks block_bytes",
                    operation="CxlkvSecondaryTier",
                    hint="set block_bytes to the primary tier's block size in bytes")
            self._att = Attachment(tier_kwargs, "CxlkvSecondaryTier")
            model = str(getattr(getattr(vllm_config, "model_config", None), "model", "") or "")
            layout = str(tier_kwargs.get("namespace_layout", ""))
            ns = Namespace(self._att.tenant, model,
                           f"vllm block_bytes={tier_kwargs['block_bytes']} {layout}".strip())
            try:
                self._tier = OffloadTier(self._att.domain, ns, primary_kv_view,
                                         block_bytes=int(tier_kwargs["block_bytes"]))
            except BaseException:
                self._att.close()
                raise
            self._result_fields = {f.name for f in dataclasses.fields(_JobResult)}

        @staticmethod
        def get_tier_type() -> str:
            return TIER_TYPE

        @property
        def tier(self) -> OffloadTier:
            return self._tier

        def lookup(self, key: Any, req_context: Any) -> Optional[bool]:
            return self._tier.lookup(key, req_context)

        def submit_store(self, job_metadata: Any) -> None:
            self._tier.submit_store(_job(job_metadata))

        def submit_load(self, job_metadata: Any) -> None:
            self._tier.submit_load(_job(job_metadata))

        def get_finished(self) -> Iterable[Any]:
            out: List[Any] = []
            for r in self._tier.get_finished():
                extra = {k: getattr(r, k) for k in ("successful_keys", "transfer_time",
                                                     "transfer_bytes")
                         if k in self._result_fields}
                out.append(_JobResult(job_id=r.job_id, success=r.success, **extra))
            return out

        def touch(self, keys: Any, req_context: Any) -> None:
            self._tier.touch(keys, req_context)

        def shutdown(self) -> None:
            self._tier.shutdown()
            self._att.close()

else:
    CxlkvSecondaryTier = None  # type: ignore[assignment,misc]


def _job(job: Any) -> TierJob:
    return TierJob(job.job_id, list(job.keys), job.block_ids,
                   bool(getattr(job, "is_promotion", False)), getattr(job, "req_context", None))


def register() -> None:
    """Makes the ``cxlkv`` tier type known to vLLM's secondary-tier factory.

    Uses ``SecondaryTierFactory.register_tier`` where the installed vLLM has it, else the
    0.22 factory's registry of tier classes.

    Raises:
        EngineVersionError: vLLM is missing, or its factory offers neither.
    """
    if CxlkvSecondaryTier is None:
        raise EngineVersionError(f"vLLM is not importable: {IMPORT_ERROR}", operation="register",
                                 hint="install vLLM 0.22.x in this environment")
    from vllm.v1.kv_offload.tiering import factory

    fac = getattr(factory, "SecondaryTierFactory", None)
    if fac is not None and hasattr(fac, "register_tier"):
        fac.register_tier(TIER_TYPE, __name__, "CxlkvSecondaryTier")
        return
    registry = getattr(factory, "_TIER_REGISTRY", None)
    if isinstance(registry, dict):
        registry[TIER_TYPE] = CxlkvSecondaryTier
        return
    raise EngineVersionError(
        "vllm.v1.kv_offload.tiering.factory has neither SecondaryTierFactory.register_tier nor "
        "_TIER_REGISTRY", operation="register",
        hint="run python -m cxlkv.integrations.check; this vLLM is outside the adapter's pin")
