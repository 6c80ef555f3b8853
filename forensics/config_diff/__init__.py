"""A run's configuration in canonical keys, and the differences between a proxy and its target.

:func:`extract_config` reads every configuration a run folder carries (``config.json``/``*.yaml``
files, W&B ``config.yaml`` with its ``{"key": {"value": v}}`` wrapping, TensorBoard hparams, Hugging
Face ``TrainingArguments``, Megatron-LM/DeepSpeed arguments printed in the log) into one flat dict of
the canonical settings of :data:`CANONICAL`. :func:`diff` lists every setting that differs between two
such dicts, each with whether it matters for transferring hyper-parameters from a proxy to a target
and why (the mechanism and its source, :func:`why_matters`).

Sources of the mechanisms: Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
training instabilities", arXiv 2309.14322 (attention-logit growth and qk-layernorm s3.1.1, output-logit
divergence and z-loss s3.1.2, warm-up s3.2.1, independent weight decay s3.2.2, muParam s3.2: numbers
checked against its table of contents; AdamW epsilon s3.4: as recalled, not checked); Yang et al. 2022
(muP/muTransfer), arXiv 2203.03466; Chowdhery et al. 2022 (PaLM z-loss), arXiv 2204.02311.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forensics.config_diff._read import (
    ALIASES,
    CANONICAL,
    canonical_precision,
    extract_config,
    flat_config,
    same,
    unwrap_wandb,
)
from forensics.config_diff.mup import claims_mup, mup_check
from forensics.config_diff.why import WHY, why_matters

__all__ = ["ALIASES", "CANONICAL", "WHY", "canonical_precision", "claims_mup", "diff", "extract_config",
           "flat_config", "mup_check", "same", "unwrap_wandb", "why_matters"]


def diff(proxy_cfg: Mapping[str, Any], target_cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every canonical setting whose value differs between the proxy and the target.

    A setting present on one side only is a difference too (``None`` on the other side): a switch the
    proxy records and the target does not (qk-layernorm, z-loss) may have been dropped.

    Args:
        proxy_cfg: :func:`extract_config` of the proxy (the run that trained well).
        target_cfg: :func:`extract_config` of the target (the run that did not).

    Returns:
        ``[{"setting", "proxy", "target", "matters": bool, "why"}]`` in :data:`CANONICAL` order; ``why``
        names the mechanism and its source (:func:`why_matters`).
    """
    out: list[dict[str, Any]] = []
    for key in CANONICAL:
        p, t = proxy_cfg.get(key), target_cfg.get(key)
        if (p is None and t is None) or same(p, t):
            continue
        matters, why = why_matters(key, p, t, proxy_cfg, target_cfg)
        out.append({"setting": key, "proxy": p, "target": t, "matters": matters, "why": why})
    return out
