"""The engine adapters: version pins, the structural check, and (where the engine is installed)
the adapters themselves. No stand-in engine package is used anywhere: without SGLang or vLLM
the adapter tests skip, and the stores underneath are tested in test_page_store.py,
test_offload_tier.py and test_multihost.py."""

from __future__ import annotations

import abc
import importlib.util
import os
import subprocess
import sys

import pytest

from cxlkv import integrations
from cxlkv.errors import EngineVersionError
from cxlkv.integrations import check
from conftest import HERE

HAVE = {e: importlib.util.find_spec(e) is not None for e in ("sglang", "vllm")}


def test_versions_inside_the_pin_pass_and_outside_are_refused() -> None:
    integrations.check_engine_version("vllm", "0.22.1")
    integrations.check_engine_version("vllm", "0.22.0rc1+cu124")
    integrations.check_engine_version("vllm", "0.33.2")
    integrations.check_engine_version("sglang", "0.5.3rc2")
    for engine, version in [("vllm", "0.21.9"), ("vllm", "0.34.0"), ("sglang", "0.5.2"),
                            ("sglang", "0.4.10"), ("sglang", "1.0"), ("vllm", "dev"),
                            ("vllm", None)]:
        with pytest.raises(EngineVersionError) as e:
            integrations.check_engine_version(engine, version)
        msg = str(e.value)
        assert (version or "version unknown") in msg and "outside" in msg
        pin = integrations.TARGETS[engine]
        assert f"{engine}>={pin.min_version},<{pin.below_version}" in e.value.hint
        assert "cxlkv.integrations.check" in e.value.hint
        assert "allow_untested_version" in e.value.hint
    integrations.check_engine_version("vllm", "0.40.0", allow_untested=True)
    from cxlkv.integrations import vllm_generations as gens

    # v0.25.0's SecondaryTierManager already has the 0.26 interface (docs/engines.md).
    assert [gens.generation_for(v).name for v in ("0.22.1", "0.23.0", "0.24.1", "0.25.0",
                                                    "0.25.1", "0.26.0", "0.27.1", "0.28.0",
                                                    "0.31.1", "0.32.0", "0.33.1")] == [
        "0.22", "0.23", "0.23", "0.26", "0.26", "0.26", "0.26", "0.28", "0.28", "0.32", "0.32"]
    assert gens.generation_for("0.21.0") is None and gens.generation_for("0.34.0") is None
    with pytest.raises(EngineVersionError, match="no cxlkv adapter for engine 'trtllm'"):
        integrations.check_engine_version("trtllm", "1.0")


def test_parse_version() -> None:
    assert integrations.parse_version("0.22.1rc1+cu12") == (0, 22, 1)
    assert integrations.parse_version("v1.2") == (1, 2)
    assert integrations.parse_version("garbage") == ()


def test_the_interface_check_finds_missing_and_mismatched_methods() -> None:
    class Base(abc.ABC):
        @abc.abstractmethod
        def lookup(self, key, req_context): ...

        @abc.abstractmethod
        def get_finished(self): ...

    class Fits(Base):
        def lookup(self, key, req_context):
            return None

        def get_finished(self):
            return []

    class Drifted(Base):
        def lookup(self, key):  # the engine added a parameter since
            return None

    assert check._interface(Base, Fits) == []
    problems = check._interface(Base, Drifted)
    assert any("get_finished" in p for p in problems)
    assert any("lookup('key', 'req_context') in Base" in p for p in problems)
    assert check._interface(Base, None) == ["the adapter class was not defined"]


def test_adapters_import_without_their_engines() -> None:
    from cxlkv.integrations import sglang as sg, vllm as vl

    for mod, engine in ((sg, "sglang"), (vl, "vllm")):
        if HAVE[engine]:
            continue
        assert mod.IMPORT_ERROR is not None
    if not HAVE["sglang"]:
        assert sg.CxlkvHiCacheStorage is None
    if not HAVE["vllm"]:
        assert vl.CxlkvSecondaryTier is None
        with pytest.raises(EngineVersionError, match="vLLM is not usable"):
            vl.register()


def test_the_check_command() -> None:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    r = subprocess.run([sys.executable, "-m", "cxlkv.integrations.check", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    findings = {f["engine"]: f for f in __import__("json").loads(r.stdout)}
    assert set(findings) == {"sglang", "vllm"}
    for engine, f in findings.items():
        if HAVE[engine]:
            assert f["status"] in ("ok", "failed") and "version" in f
        else:
            assert f["status"] == "not installed" and engine in f["reason"]
    if not any(HAVE.values()):
        assert r.returncode == 77
    else:
        assert r.returncode == (1 if any(f["status"] == "failed" for f in findings.values())
                                else 0)


@pytest.mark.skipif(not HAVE["sglang"], reason="SGLang is not installed here (it cannot be, "
                    "offline); the PageStore under the adapter is tested in test_page_store.py")
def test_sglang_adapter_against_the_installed_engine() -> None:
    f = check.check_engine("sglang")
    assert f["status"] == "ok", f["problems"]


@pytest.mark.skipif(not HAVE["vllm"], reason="vLLM is not installed here (it cannot be, "
                    "offline); the OffloadTier under the adapter is tested in "
                    "test_offload_tier.py")
def test_vllm_adapter_against_the_installed_engine() -> None:
    f = check.check_engine("vllm")
    assert f["status"] == "ok", f["problems"]


@pytest.mark.parametrize("version,path", [("0.5.3", "the generic copy path"),
                                          ("0.5.5.post3", "the generic copy path"),
                                          ("0.5.6", "zero-copy with interface_v1"),
                                          ("0.5.9", "zero-copy with interface_v1")])
def test_the_check_names_sglangs_adapter_and_its_transfer_path(version: str, path: str) -> None:
    """SGLang has one adapter class; the check names it and the path SGLang's controller gives
    a dynamic backend at that release (zero-copy from 0.5.6, docs/engines.md)."""
    f = {"version": version, "problems": [], "notes": []}
    check._sglang_generation(f, None)
    assert f["generation"].startswith("HiCacheStorage")
    assert f["why"][1] == f"version {version}: {path}"
    assert "no v2 pool interface" in f["why"][-1]


def test_the_check_says_whether_sglangs_base_has_the_v2_pool_interface() -> None:
    """From 0.5.10 the base class carries batch_*_v2 for a hybrid model's other pools; the
    check says which interface the installed base has (sglang_interfaces states both)."""
    import types

    import sglang_interfaces as S
    from cxlkv.integrations import sglang as adapter

    for base, v2 in ((S.HiCacheStorage, False), (S.HiCacheStorage0518, True)):
        mod = types.SimpleNamespace(CxlkvHiCacheStorage=adapter.build_backend_class(base, "0.5.18"))
        f = {"version": "0.5.18", "problems": [], "notes": []}
        check._sglang_generation(f, mod)
        assert ("has the v2 pool interface" in f["why"][-1]) == v2, f["why"]
