"""fp16-ness inferred from the logs when no configuration names the precision.

A dynamic fp16 loss scaler (torch GradScaler growth_factor 2 / backoff_factor 0.5, DeepSpeed
DynamicLossScaler, fairseq) leaves a power-of-two scale moving by factors of two, skipped steps
and "loss scale" log lines; a constant ``loss scale: 1.0`` (Megatron bf16) is not fp16 evidence,
and an explicit config precision always wins.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.api import analyze
from forensics.facts import infer_fp16_from_metrics, precision
from forensics.model import RunData
from forensics.schema import EVENTS_SCHEMA, METRICS_SCHEMA


def is_fp16(run: RunData) -> bool | None:
    """The run's fp16-ness as :func:`forensics.facts.precision` infers it (its reason must be stated)."""
    fp16, why = precision(run)
    assert why
    return fp16

OVERFLOW = Path(__file__).resolve().parents[1] / "sample_logs" / "overflow"


def _run(series: dict[str, list[float]], meta: dict | None = None,
         events: list[tuple[int | None, str, str]] = ()) -> RunData:
    rows = [{"run": "r", "segment": 0, "step": i + 1, "metric": name, "value": float(v), "wall_time": None,
             "tag": name, "source": "m.jsonl"}
            for name, vals in series.items() for i, v in enumerate(vals)]
    metrics = pl.from_arrow(METRICS_SCHEMA.empty_table())
    if rows:
        metrics = pl.concat([metrics, pl.DataFrame(rows, schema=metrics.schema)])
    ev = pl.from_arrow(EVENTS_SCHEMA.empty_table())
    if events:
        ev = pl.concat([ev, pl.DataFrame([{"run": "r", "segment": 0, "step": st, "kind": k, "message": m,
                                            "source": "train.log"} for st, k, m in events], schema=ev.schema)])
    return RunData(run="r", metrics=metrics, events=ev, meta=meta or {}, sources=[], skipped=[])


def test_tensorboard_only_overflow_copy_is_an_activation_overflow(tmp_path: Path) -> None:
    """The overflow sample with only its event file (no config.json, no train.log) keeps its diagnosis."""
    files = sorted(OVERFLOW.glob("events.out.tfevents.*"))
    assert files
    for f in files:
        shutil.copy(f, tmp_path / f.name)
    a = analyze(tmp_path)
    assert (a.cause, a.mechanism) == ("overflow", "activation_overflow"), a.summary
    assert a.confidence >= 0.85, a.summary  # calibrated (forensics/calibration.json): the share right of such answers


def test_constant_loss_scale_one_is_not_fp16() -> None:
    """A bf16-like run (Megatron prints a constant ``loss scale: 1.0``, 0 skipped) is not fp16."""
    n = 50
    run = _run({"loss": list(np.linspace(4.0, 2.0, n)), "loss_scale": [1.0] * n, "skipped_step": [0.0] * n,
                "attn_logit_max": [10.0] * (n - 1) + [float("inf")]})
    assert infer_fp16_from_metrics(run) is None
    assert not is_fp16(run)


def test_bare_overflow_skip_without_scale_is_not_fp16() -> None:
    """bf16/fp32 DeepSpeed engines print "OVERFLOW! Rank 0 Skipping step." with no scale."""
    run = _run({"loss": [3.0, 2.9, 2.8]}, events=[(2, "overflow_skip", "OVERFLOW! Rank 0 Skipping step.")])
    assert not is_fp16(run)


@pytest.mark.parametrize(("scales", "skipped"), [
    ([65536.0] * 10 + [32768.0] * 5 + [16384.0] * 5, None),  # GradScaler backoff_factor 0.5
    ([128.0, 256.0, 512.0, 1024.0], None),  # growth_factor 2
    ([65536.0] * 6, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),  # power of two with skipped steps
])
def test_dynamic_loss_scale_means_fp16(scales: list[float], skipped: list[float] | None) -> None:
    """A power-of-two scale moving by factors of 2, or with skipped steps, is an fp16 scaler."""
    series = {"loss_scale": scales, **({"skipped_step": skipped} if skipped else {})}
    assert is_fp16(_run(series)) is True


def test_non_power_of_two_or_constant_scale_is_no_evidence() -> None:
    """A scale that is not a power of two, or a constant one with no skips, proves nothing."""
    assert is_fp16(_run({"loss_scale": [1000.0, 500.0, 250.0]})) is None
    assert is_fp16(_run({"loss_scale": [65536.0] * 5, "skipped_step": [0.0] * 5})) is None


def test_scaler_log_events_mean_fp16() -> None:
    """DeepSpeed/fairseq loss-scale lines are fp16 evidence even without a scale series."""
    ds = _run({"loss": [3.0, 2.9]}, events=[(None, "overflow_skip", "[deepspeed] OVERFLOW! Rank 0 Skipping step. "
                                                  "Attempted loss scale: 65536, reducing to 32768")])
    fs = _run({"loss": [3.0, 2.9]}, events=[(None, "loss_scale_change", "loss scale set to 64.0")])
    assert is_fp16(ds) is True
    assert is_fp16(fs) is True


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_explicit_config_precision_wins_over_inference(precision: str) -> None:
    """A config that says bf16/fp32 is believed over a scale that looks like an fp16 scaler."""
    run = _run({"loss_scale": [65536.0, 32768.0, 16384.0]},
               meta={"config_files": {"config.json": {"precision": precision}}})
    assert is_fp16(run) is False
