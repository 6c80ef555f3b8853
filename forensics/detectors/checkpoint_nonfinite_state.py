"""CK01 checkpoint.nonfinite_state: the first checkpoint holding NaN/inf in weights or optimizer moments.

Rule (DESIGN.md section 4, cause ``overflow`` / mechanism ``nonfinite_state``; docs/formats.md#optimizer-state:
"``sqrt(exp_avg_sq)`` blow-ups, ``exp_avg`` NaNs"): the earliest checkpoint whose ``tensors`` rows
count a NaN or an inf, with the tensors and their roles (``param``, ``exp_avg``, ``exp_avg_sq``...).
An inf in Adam's second moment freezes its coordinates silently (``m / sqrt(inf) = 0``) and a NaN in
the first moment or a weight poisons the next step: either way every resume from that checkpoint
carries it, so the recovery plan must start from an earlier one (forensics/recovery/overflow.py).
When the logged loss or parameter norm was already non-finite at or before that checkpoint, the
state is a consequence of a failure the logs show,
and the finding only argues weakly for ``overflow`` (confidence 0.45 < 0.5).

Source: docs/detectors.md#ck01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, checkpoint_segment
from forensics.model import Cause, Finding, Mechanism, RunData, Severity


@dataclass(frozen=True)
class CheckpointNonFinite(Detector):
    """The first checkpoint with non-finite weights or optimizer state, and which tensors."""

    code = "CK01"
    name = "checkpoint.nonfinite_state"
    max_listed: int = 12
    max_named: int = 3
    silent_confidence: float = 0.9
    visible_confidence: float = 0.45

    def missing(self, run: RunData) -> str | None:
        """Skip reason when the run folder had no readable checkpoint tensors."""
        return None if run.tensors.height else "needs checkpoint tensors (no readable checkpoint in the run folder)"

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the earliest checkpoint with a NaN/inf, its tensors and roles."""
        t = run.tensors.filter(pl.col("step").is_not_null())
        bad = t.filter((pl.col("n_nan") + pl.col("n_inf")) > 0)
        if bad.height == 0:
            return []
        step = int(bad.get_column("step").min())  # type: ignore[arg-type]
        first = bad.filter(pl.col("step") == step).sort(["role", "tensor"])
        ckpt = str(first.get_column("checkpoint")[0])
        partial = {c.get("step") for c in run.meta.get("checkpoints") or [] if not c.get("complete", True)}
        finite_before = sorted({int(s) for s in t.filter(pl.col("step") < step).get_column("step").to_list()}
                               - {int(s) for s in bad.get_column("step").to_list()} - partial)
        prev = finite_before[-1] if finite_before else None
        roles = {r: {"tensors": n, "nan": int(a), "inf": int(b)} for r, n, a, b in first.group_by("role").agg(
            pl.len(), pl.col("n_nan").sum(), pl.col("n_inf").sum()).sort("role").iter_rows()}
        listed = [{"tensor": r["tensor"], "role": r["role"], "n_nan": r["n_nan"], "n_inf": r["n_inf"],
                   "numel": r["numel"], "shape": r["shape"]} for r in first.head(self.max_listed).iter_rows(named=True)]
        visible = None
        for m in ("loss", "param_norm"):
            s = run.series(m)
            if s is not None and len(s):
                idx = np.flatnonzero(~np.isfinite(s.values) & (s.steps <= step))
                if idx.size and (visible is None or int(s.steps[idx[0]]) < visible[0]):
                    visible = (int(s.steps[idx[0]]), m)
        what = ", ".join(f"{v['tensors']} {r} tensor(s) ({v['nan']} NaN, {v['inf']} inf)" for r, v in roles.items())
        names = ", ".join(f"{d['role']} of {d['tensor']}" for d in listed[: self.max_named])
        since = f"; the previous complete checkpoint (step {prev}) is finite" if prev is not None else \
            "; no earlier complete checkpoint to compare"
        against: tuple[str, ...] = ()
        conf = self.silent_confidence
        if visible is not None:
            conf = self.visible_confidence
            against = (f"the logged {visible[1]} was already non-finite at step {visible[0]}, before this checkpoint: "
                       "the non-finite state is a consequence of a failure the logs show",)
        return [self.finding(
            cause=Cause.OVERFLOW, mechanism=Mechanism.NONFINITE_STATE, step=step, segment=checkpoint_segment(run, step),
            confidence=conf, severity=Severity.CRITICAL,
            message=f"checkpoint {ckpt} (step {step}) holds non-finite values: {what}, e.g. {names}{since}; "
            "never resume from it.",
            evidence={"checkpoint": ckpt, "step": step, "previous_finite_checkpoint_step": prev, "roles": roles,
                      "tensors": listed, "n_tensors_nonfinite": first.height,
                      "later_nonfinite_checkpoints": sorted(set(bad.get_column("step").to_list()) - {step}),
                      "first_nonfinite_logged": visible and {"step": visible[0], "metric": visible[1]}},
            against=against,
        )]
