"""The shared-prefix serving demo (cxlkv.demo): a real transformer whose KV blocks one host
publishes and another loads instead of recomputing them.

The model tests run in this process; the domain tests publish and load through a file-backed
domain with an owner thread; the end-to-end tests run ``python -m cxlkv.demo`` (two host
processes under a real cxlkv-orchestrator) small."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import cxlkv  # noqa: E402
from conftest import HERE, Env, run_program  # noqa: E402
from cxlkv.demo import share  # noqa: E402
from cxlkv.demo.__main__ import ok  # noqa: E402
from cxlkv.demo.hosts import DemoConfig, HostSpec, run  # noqa: E402
from cxlkv.demo.model import KvSpec, ModelConfig, TinyDecoder  # noqa: E402
from cxlkv.demo.orchestrator import LocalOrchestrator, find_orchestrator  # noqa: E402

SMALL = ModelConfig(vocab=512, layers=2, heads=2, head_dim=16, mlp=64)
KV = KvSpec(16)
SMALL_ARGS = ["--layers", "2", "--heads", "2", "--head-dim", "16", "--mlp", "64",
              "--vocab", "512"]
PROMPT = 70  # 4 full blocks of 16 tokens, and 6 tokens that no block covers


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, SMALL.vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(SMALL)


# ---- the model ------------------------------------------------------------------------------

def test_equal_configs_give_equal_weights_and_fingerprints(model: TinyDecoder) -> None:
    again = TinyDecoder(SMALL)
    assert all(torch.equal(a, b) for a, b in zip(model.tensors(), again.tensors()))
    assert again.fingerprint() == model.fingerprint()
    other = TinyDecoder(ModelConfig(vocab=512, layers=2, heads=2, head_dim=16, mlp=64, seed=5))
    assert other.fingerprint() != model.fingerprint()


def test_a_prefix_cache_copied_in_gives_the_from_scratch_logits(model: TinyDecoder) -> None:
    full = tokens(PROMPT + 19)
    cold = model.new_cache(KV, full.numel())
    ref = model.prefill(full, cold)
    pub = model.new_cache(KV, PROMPT)
    model.prefill(full[:PROMPT], pub)  # another run, of the prompt alone
    cache = model.new_cache(KV, full.numel())
    cache.blocks[:4] = pub.blocks[:4]
    cache.length = 64
    before = model.tokens_computed
    out = model.prefill(full[64:], cache)
    assert model.tokens_computed - before == full.numel() - 64
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (out - ref).abs().max()
    assert torch.equal(cache.blocks[:4], cold.blocks[:4])  # the same positions, the same KV


def test_a_wrong_kv_value_in_a_loaded_block_changes_the_logits(model: TinyDecoder) -> None:
    # The equality the demo checks is not vacuous: the loaded blocks are really attended to.
    full = tokens(PROMPT + 10, seed=1)
    ref = model.prefill(full, model.new_cache(KV, full.numel()))
    cache = model.new_cache(KV, full.numel())
    model.prefill(full[:64], cache)
    cache.blocks[1, 1, 0, 0, :, 3] += 1.0  # the values of one position of layer 0, head 0
    out = model.prefill(full[64:], cache)
    assert not torch.allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_prefill_refuses_bad_input(model: TinyDecoder) -> None:
    cache = model.new_cache(KV, 32)
    with pytest.raises(ValueError, match="token ids"):
        model.prefill(torch.tensor([SMALL.vocab]), cache)
    with pytest.raises(ValueError, match="exceed the cache"):
        model.prefill(tokens(33), cache)
    with pytest.raises(ValueError, match="no tokens"):
        model.prefill(torch.tensor([], dtype=torch.long), cache)
    assert cache.length == 0


# ---- manifests ------------------------------------------------------------------------------

def _manifest(cfg: ModelConfig, kv: KvSpec) -> Dict[str, Any]:
    m = TinyDecoder(cfg)
    fp = m.fingerprint()
    return share.manifest(m, kv, fp, share.model_namespace("t", m, kv, fp), 4, 7)


def test_manifest_round_trip_and_the_differences_it_names() -> None:
    mine = _manifest(SMALL, KV)
    assert share.decode_manifest(share.encode_manifest(mine)) == mine
    assert share.compare(mine, mine) == []
    deeper = _manifest(ModelConfig(vocab=512, layers=3, heads=2, head_dim=16, mlp=64), KV)
    assert share.compare(deeper, mine) == ["layers: 3 vs 2"]
    assert share.compare(_manifest(SMALL, KvSpec(8)), mine) == ["tokens_per_block: 8 vs 16"]
    with pytest.raises(share.ModelMismatchError) as e:
        share.check_publisher(deeper, mine, "host 3")
    text = str(e.value)
    assert "refusing the shared prompt" in text and "host 7" in text
    assert deeper["model"] in text and mine["model"] in text and "layers: 3 vs 2" in text
    assert isinstance(e.value, cxlkv.errors.MismatchError)
    with pytest.raises(ValueError, match="not JSON|length"):
        share.decode_manifest(share.encode_manifest(mine)[:40])
    with pytest.raises(ValueError, match="not a"):
        share.decode_manifest(share.encode_manifest({"magic": "other"}))


# ---- publish and load through a domain (file-backed, owner thread) --------------------------

def _wait_visible(d: cxlkv.Domain, ns: cxlkv.Namespace, key: cxlkv.PrefixKey) -> None:
    from conftest import wait_until

    wait_until(lambda: d.lookup(ns, key) is not None, what="the publication to be applied")


def test_blocks_load_into_a_cache_and_other_layouts_never_see_them(
        make_env: Callable[..., Env], model: TinyDecoder) -> None:
    block_bytes = KV.layout(SMALL).block_bytes
    env = make_env(block_bytes=block_bytes, blocks=64)
    a, b = env.host(1), env.host(2)
    fp = model.fingerprint()
    full = tokens(PROMPT + 12, seed=2)
    prompt = [int(t) for t in full[:PROMPT]]
    pub_cache = model.new_cache(KV, PROMPT)
    model.prefill(full[:PROMPT], pub_cache)
    published = share.publish_prefix(a, "t", model, KV, fp, prompt, pub_cache)
    assert (published.blocks, published.bytes) == (4, 4 * block_bytes)
    ns = share.model_namespace("t", model, KV, fp)
    _wait_visible(b, ns, published.keys[-1])
    assert share.wait_for_manifest(b, "t", prompt, 5.0)["blocks"] == 4

    cache = model.new_cache(KV, full.numel())
    loaded = share.load_prefix(b, ns, KV, [int(t) for t in full], cache)
    assert (loaded.blocks_leased, loaded.blocks_loaded, cache.length) == (4, 4, 64)
    assert loaded.bytes_copied == 4 * block_bytes
    assert torch.equal(cache.blocks[:4], pub_cache.blocks[:4])
    ref = model.prefill(full, model.new_cache(KV, full.numel()))
    assert torch.allclose(model.prefill(full[64:], cache), ref, rtol=1e-5, atol=1e-5)

    # A request that is exactly the prompt's 4 blocks keeps its last block to run.
    cache = model.new_cache(KV, 64)
    assert share.load_prefix(b, ns, KV, prompt[:64], cache).blocks_loaded == 3

    # Another model or KV layout has another namespace: no block of this one is found.
    for other_model, other_kv in ((TinyDecoder(ModelConfig(vocab=512, layers=2, heads=2,
                                                           head_dim=16, mlp=64, seed=9)), KV),
                                  (model, KvSpec(8))):
        other_ns = share.model_namespace("t", other_model, other_kv)
        assert other_ns.id != ns.id
        cache = other_model.new_cache(other_kv, full.numel())
        got = share.load_prefix(b, other_ns, other_kv, [int(t) for t in full], cache)
        assert (got.blocks_leased, got.blocks_loaded, cache.length) == (0, 0, 0)


# ---- end to end: two host processes under a cxlkv-orchestrator ------------------------------

def _need_orchestrator() -> None:
    if find_orchestrator() is None:
        pytest.skip("cxlkv-orchestrator not built (cmake --build build/dev --target "
                    "cxlkv-orchestrator), nor CXLKV_ORCHESTRATOR_BIN set")


def test_demo_end_to_end_loads_the_prompt_and_reproduces_the_logits(tmp_path: Path) -> None:
    _need_orchestrator()
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    # SIGTERM, not SIGKILL, on a timeout or an interruption: the demo removes its domain.
    r = run_program([sys.executable, "-m", "cxlkv.demo", *SMALL_ARGS, "--prompt-tokens",
                     str(PROMPT), "--requests", "3", "--suffix-tokens", "5:20", "--json",
                     str(out)], 300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "next-token logits with the shared prefix vs from scratch" in r.stdout
    report = json.loads(out.read_text())
    block_bytes = KV.layout(SMALL).block_bytes
    assert report["publisher"]["blocks"] == 4
    assert report["publisher"]["bytes"] == 4 * block_bytes
    reqs = report["server"]["requests"]
    assert len(reqs) == 3
    for q in reqs:
        # The prompt's 4 blocks were copied in, and the model ran only the other positions.
        assert q["blocks_leased"] == q["blocks_loaded"] == 4
        assert q["tokens_loaded"] == 64
        assert q["tokens_run_shared"] == q["tokens"] - 64
        assert q["tokens_run_cold"] == q["tokens"]
        assert q["bytes_copied"] == 4 * block_bytes
        assert q["logits_allclose"], q["logits_max_abs_diff"]
        assert q["next_token_cold"] == q["next_token_shared"]
        assert q["kv_identical"]
    assert ok(report)
    bad = json.loads(out.read_text())
    bad["summary"]["blocks_loaded"][0] = 3
    assert not ok(bad)


@pytest.mark.parametrize("b_spec,differs", [
    (HostSpec(ModelConfig(vocab=512, layers=3, heads=2, head_dim=16, mlp=64), KV),
     "layers: 2 vs 3"),
    (HostSpec(SMALL, KvSpec(8)), "tokens_per_block: 16 vs 8"),
])
def test_a_server_with_another_model_or_layout_refuses_the_prompt(b_spec: HostSpec,
                                                                  differs: str) -> None:
    _need_orchestrator()
    with LocalOrchestrator() as orch:
        cfg = DemoConfig(domain=orch.spec, tenant="pytest", prompt_tokens=PROMPT, requests=1,
                         suffix_tokens=(4, 4), a=HostSpec(SMALL, KV), b=b_spec, timeout_s=120)
        with pytest.raises(share.ModelMismatchError, match=differs) as e:
            run(cfg)
    assert "refusing the shared prompt" in str(e.value)
    assert "serve with the publisher's model and KV layout" in str(e.value)
