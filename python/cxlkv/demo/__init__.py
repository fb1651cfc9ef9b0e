"""A shared system prompt served from a CXL domain by two processes of a real transformer.

``python -m cxlkv.demo [--socket <orchestrator socket>]`` runs a small decoder-only
transformer (:mod:`cxlkv.demo.model`: seeded weights, rotary attention, a KV cache paged in
blocks of ``kv × layer × head × head_dim × token``) as two serving processes that join one
domain as two hosts, under a cxlkv-orchestrator (a running one, or a private one it starts):

1. host A prefills a shared system prompt and publishes its KV blocks under chained prefix
   keys, in an arena it grows in an extent of the domain's pooled region, with a manifest
   naming the model and KV layout (:mod:`cxlkv.demo.share`);
2. host B serves requests that start with the prompt: it looks up the chain, leases the
   blocks, copies them out (validated) into its KV cache instead of recomputing them, and
   prefills only the rest. Each request is also served from scratch, and the next-token
   logits of the two must be equal; the time to first token of both is reported, with the
   blocks loaded and the bytes copied (:mod:`cxlkv.demo.hosts`).

A host B with another model or KV layout refuses the prompt (:class:`ModelMismatchError`):
the namespace holds the model's fingerprint and the layout, so the blocks could not be found
anyway, and the manifest says why. Needs ``torch`` (Debian's ``python3-torch``).
"""

from __future__ import annotations

from .hosts import DemoConfig, DemoError, HostSpec, run
from .model import KvCache, KvSpec, ModelConfig, TinyDecoder
from .share import ModelMismatchError

__all__ = ["DemoConfig", "DemoError", "HostSpec", "KvCache", "KvSpec", "ModelConfig",
           "ModelMismatchError", "TinyDecoder", "run"]
