"""A small decoder-only transformer with a block-paged KV cache (the demo's model).

The model is real, only small: token embeddings, ``layers`` pre-norm blocks of rotary
multi-head self-attention and a SwiGLU MLP, a final norm and a language-model head, every
weight drawn from a seeded generator, so two processes that build the same
:class:`ModelConfig` hold bit-identical weights. Computation is float32 on the CPU.

The KV cache is paged the way serving engines page it: a tensor of blocks, each holding
``tokens_per_block`` consecutive positions of every layer's keys and values, laid out

    block[kv][layer][head][head_dim][token]        (kv: 0 = keys after RoPE, 1 = values)

so one block is ``2 * layers * heads * head_dim * tokens_per_block`` float32 values — the
``cxlkv.KvLayout`` of an arena holding them — and a block is one contiguous row of the cache
tensor, which is what a shared block is copied into or published from.

:meth:`TinyDecoder.prefill` is the only forward pass: it appends the given tokens' keys and
values to a cache that may already hold earlier positions (computed here, or copied in from
another host) and returns the next-token logits of the last token. A from-scratch run is
``prefill(all tokens, empty cache)``; a run that reuses a shared prefix is ``prefill(rest,
cache holding the prefix blocks)``. :attr:`TinyDecoder.tokens_computed` counts every token
position the model has run, so a caller can prove which positions were not recomputed.

Thread-safety: a model may be shared by threads for reading, a cache may not.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import List

import torch

import cxlkv

DTYPE = torch.float32
DTYPE_NAME = "fp32"
DTYPE_BYTES = 4


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape and its weights' seed: equal configs give equal weights."""

    name: str = "cxlkv-tiny-decoder"
    vocab: int = 4096
    layers: int = 6
    heads: int = 4
    head_dim: int = 64
    mlp: int = 1024
    max_tokens: int = 4096
    rope_base: float = 10000.0
    seed: int = 1234

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim

    def validate(self) -> None:
        for f in ("vocab", "layers", "heads", "head_dim", "mlp", "max_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"ModelConfig.{f}={v!r}: must be a positive int")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim={self.head_dim}: rotary embeddings need an "
                             "even head_dim")


@dataclass(frozen=True)
class KvSpec:
    """How a model's KV cache is cut into blocks: the part of the layout the model does not fix.
    """

    tokens_per_block: int = 16

    def layout(self, cfg: ModelConfig) -> cxlkv.KvLayout:
        """The arena layout of one block (keys and values of every layer and head)."""
        return cxlkv.KvLayout(layers=cfg.layers, kv_heads=cfg.heads, head_dim=cfg.head_dim,
                              dtype_bytes=DTYPE_BYTES, tokens_per_block=self.tokens_per_block)

    def describe(self, cfg: ModelConfig) -> str:
        """The layout in words, dimension order included (part of the namespace)."""
        return (f"{DTYPE_NAME} kv.layer.head.dim.token L{cfg.layers} H{cfg.heads} "
                f"D{cfg.head_dim} T{self.tokens_per_block}")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


class _Layer:
    def __init__(self, cfg: ModelConfig, g: torch.Generator) -> None:
        d, m = cfg.d_model, cfg.mlp
        depth = math.sqrt(2 * cfg.layers)  # keeps the residual stream's scale across layers
        self.attn_norm = 1 + 0.1 * torch.randn(d, generator=g)
        self.wqkv = torch.randn(d, 3 * d, generator=g) / math.sqrt(d)
        self.wo = torch.randn(d, d, generator=g) / (math.sqrt(d) * depth)
        self.mlp_norm = 1 + 0.1 * torch.randn(d, generator=g)
        self.w_gate_up = torch.randn(d, 2 * m, generator=g) / math.sqrt(d)
        self.w_down = torch.randn(m, d, generator=g) / (math.sqrt(m) * depth)

    def tensors(self) -> List[torch.Tensor]:
        return [self.attn_norm, self.wqkv, self.wo, self.mlp_norm, self.w_gate_up, self.w_down]


class KvCache:
    """One request's paged KV cache: ``blocks[i]`` holds positions ``i*T .. i*T+T-1``.

    ``blocks`` has shape ``(capacity_blocks, 2, layers, heads, head_dim, T)``, C-contiguous, so
    ``blocks[:k]`` is a contiguous run of k block rows (what ``Leases.copy_out_rows`` fills)
    and ``blocks[i]`` is one block's bytes (what ``Domain.publish`` takes). ``length`` is the
    number of positions that hold keys and values.
    """

    def __init__(self, cfg: ModelConfig, kv: KvSpec, capacity_tokens: int) -> None:
        t = kv.tokens_per_block
        self.cfg, self.kv = cfg, kv
        self.blocks = torch.zeros((max(1, -(-capacity_tokens // t)), 2, cfg.layers, cfg.heads,
                                   cfg.head_dim, t), dtype=DTYPE)
        self.length = 0

    @property
    def tokens_per_block(self) -> int:
        return self.kv.tokens_per_block

    @property
    def block_bytes(self) -> int:
        return self.blocks[0].numel() * DTYPE_BYTES

    @property
    def full_blocks(self) -> int:
        """Blocks whose every position is filled (the shareable ones)."""
        return self.length // self.tokens_per_block

    def _gather(self, kv: int, layer: int, n: int) -> torch.Tensor:
        """(heads, head_dim, n): keys or values of positions 0..n-1 of one layer."""
        t = self.tokens_per_block
        nb = -(-n // t)
        h, d = self.cfg.heads, self.cfg.head_dim
        x = self.blocks[:nb, kv, layer].permute(1, 2, 0, 3).reshape(h, d, nb * t)
        return x[:, :, :n]


class TinyDecoder:
    """The model: weights from ``cfg.seed``; :meth:`prefill` runs tokens through it."""

    def __init__(self, cfg: ModelConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        d = cfg.d_model
        self.embed = torch.randn(cfg.vocab, d, generator=g)
        self.layers = [_Layer(cfg, g) for _ in range(cfg.layers)]
        self.final_norm = 1 + 0.1 * torch.randn(d, generator=g)
        self.lm_head = torch.randn(d, cfg.vocab, generator=g) / math.sqrt(d)
        half = cfg.head_dim // 2
        inv = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.arange(cfg.max_tokens, dtype=torch.float64)[:, None] * inv[None, :]
        self._cos = angles.cos().to(DTYPE)
        self._sin = angles.sin().to(DTYPE)
        self.tokens_computed = 0  # token positions run through the model, ever

    def tensors(self) -> List[torch.Tensor]:
        out = [self.embed]
        for layer in self.layers:
            out += layer.tensors()
        return out + [self.final_norm, self.lm_head]

    def parameters_count(self) -> int:
        return sum(t.numel() for t in self.tensors())

    def fingerprint(self) -> str:
        """SHA-256 of the configuration and every weight's bytes (hex): equal fingerprints mean
        the same model, so the same KV for the same tokens."""
        h = hashlib.sha256(json.dumps(asdict(self.cfg), sort_keys=True).encode())
        h.update(DTYPE_NAME.encode())
        for t in self.tensors():
            h.update(memoryview(t.contiguous().numpy()).cast("B"))
        return h.hexdigest()

    def new_cache(self, kv: KvSpec, capacity_tokens: int) -> KvCache:
        return KvCache(self.cfg, kv, capacity_tokens)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.cfg.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, cache: KvCache) -> torch.Tensor:
        """Runs `tokens` at positions ``cache.length ..``, appends their keys and values to
        `cache`, and returns the next-token logits after the last one, shape ``(vocab,)``.

        Raises:
            ValueError: no tokens, a token id outside the vocabulary, or more positions than
                the cache or the model's ``max_tokens`` hold.
        """
        cfg = self.cfg
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        n, start = tokens.numel(), cache.length
        end = start + n
        t = cache.tokens_per_block
        if n == 0:
            raise ValueError("prefill: no tokens to run")
        if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab:
            raise ValueError(f"prefill: token ids must be in 0..{cfg.vocab - 1}")
        if end > min(cfg.max_tokens, cache.blocks.shape[0] * t):
            raise ValueError(f"prefill: {end} positions exceed the cache "
                             f"({cache.blocks.shape[0] * t}) or max_tokens ({cfg.max_tokens})")
        h, d = cfg.heads, cfg.head_dim
        pos = torch.arange(start, end)
        blk, slot = pos // t, pos % t
        cos, sin = self._cos[pos][:, None, :], self._sin[pos][:, None, :]
        # Query i (position start+i) sees keys 0..start+i.
        visible = torch.arange(end)[None, :] <= pos[:, None]
        scale = 1.0 / math.sqrt(d)
        x = self.embed[tokens]
        for li, w in enumerate(self.layers):
            a = _rms_norm(x, w.attn_norm)
            q, k, v = (a @ w.wqkv).view(n, 3, h, d).unbind(1)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            cache.blocks[blk, 0, li, :, :, slot] = k
            cache.blocks[blk, 1, li, :, :, slot] = v
            keys, values = cache._gather(0, li, end), cache._gather(1, li, end)
            scores = torch.matmul(q.transpose(0, 1), keys) * scale  # (heads, n, end)
            scores = scores.masked_fill(~visible, float("-inf"))
            o = torch.matmul(torch.softmax(scores, dim=-1), values.transpose(1, 2))
            x = x + o.transpose(0, 1).reshape(n, h * d) @ w.wo
            m = _rms_norm(x, w.mlp_norm)
            gate, up = (m @ w.w_gate_up).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w.w_down
        cache.length = end
        self.tokens_computed += n
        return (_rms_norm(x[-1], self.final_norm) @ self.lm_head).contiguous()
