"""Names of model parts and numeric limits shared by detectors, the planner and the configuration diff.

Defined once here: the largest finite fp16 value, the names of the output layer (the unembedding) and of the
self-attention Q/K/V projections, as trainers log them in metric names and as checkpoints store them in tensor
names.
"""

from __future__ import annotations

import re

FP16_MAX = 65504.0
"""Largest finite IEEE 754 binary16 value: (2 - 2**-10) * 2**15; above it fp16 overflows to inf."""

OUTPUT_HEADS = frozenset({"lm_head", "output_layer", "embed_out", "unembed", "output", "head"})
"""Module names of the output layer (HF ``lm_head``, Megatron ``output_layer``, GPT-NeoX ``embed_out``,
TransformerLens ``unembed``, torchtitan/LLaMA ``output``, timm/ViT ``head``)."""

_SPECIFIC_HEADS = tuple(sorted(OUTPUT_HEADS - {"output", "head"}))
"""The output-layer names specific enough to match anywhere inside a metric name."""


def is_output_head_metric(name: str) -> bool:
    """True when a metric name is about the output layer (``params/norm/lm_head``, ``x/head``, ``head.weight``).

    The generic names ``output`` and ``head`` count only as a path part (``/head``) or with ``.weight``, so that
    ``output_logit_max`` or ``heads_per_layer`` are not taken for the output layer.
    """
    low = name.lower()
    return any(h in low for h in _SPECIFIC_HEADS) or "/head" in low or "head.weight" in low


def is_output_head_tensor(name: str) -> bool:
    """True for the weight of a top-level output layer in a checkpoint (``lm_head.weight``, ``output.weight``).

    Tensors inside numbered blocks (``layers.3.mlp.output.weight``) are not the output layer.
    """
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in OUTPUT_HEADS and not any(
        p.isdigit() for p in parts)


QKV_PROJECTIONS = {
    "q_proj": "q", "q": "q", "query": "q", "wq": "q", "to_q": "q", "q_lin": "q",
    "k_proj": "k", "k": "k", "key": "k", "wk": "k", "to_k": "k", "k_lin": "k",
    "v_proj": "v", "v": "v", "value": "v", "wv": "v", "to_v": "v", "v_lin": "v",
}
"""Module names of the separate Q, K and V projections of attention, by role (HF LLaMA/OPT/GPT-J ``q_proj``,
BERT ``query``/``key``/``value``, Meta LLaMA and torchtitan ``wq``, diffusers ``to_q``, DistilBERT ``q_lin``,
timm/nanoGPT-style ``q``)."""

_QKV_SUFFIX = re.compile(r"(?<![qkv])(?P<which>[qkv])(?:_?proj)?$")
"""Any other name ending in one of q, k, v, optionally followed by ``proj`` or ``_proj`` (``attn_q``, ``qproj``,
``layer0.wq``). A letter of q/k/v right before it marks a fused projection (``qkv``, ``kv``, ``to_kv``): no role."""


def qkv_role(part: str) -> str | None:
    """The attention projection a module name stands for: ``"q"``, ``"k"``, ``"v"`` or ``None``.

    Args:
        part: a module name (``q_proj``, ``wq``, ``to_q``, ``query``, ``q_lin``, ``qproj``), or the last part of a
            metric or tensor name (``layers.0.attn.q``), with or without a ``.weight`` suffix; any case.

    Returns:
        The role from :data:`QKV_PROJECTIONS`, else from the name's ending (:data:`_QKV_SUFFIX`); ``None`` for
        anything else, fused projections (``qkv``, ``kv_proj``) included: their rows are not separable from
        per-tensor statistics.
    """
    low = part.lower().removesuffix(".weight")
    if low in QKV_PROJECTIONS:
        return QKV_PROJECTIONS[low]
    m = _QKV_SUFFIX.search(low)
    return m.group("which") if m else None
