"""Names of model parts and numeric limits shared by detectors, the planner and the configuration diff.

Defined once here: the largest finite fp16 value and the names of the output layer (the unembedding), as
trainers log them in metric names and as checkpoints store them in tensor names.
"""

from __future__ import annotations

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
