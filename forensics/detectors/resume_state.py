"""RS01 resume.state: what the loss, grad norm and update scale say about each resume.

At every resume (a new segment, or a wall-clock restart inside one: ``RESTART_GAP_S``) whose lr continues the
earlier schedule (LR01 judges the lr), the first logged points of the new process are compared with the
earlier process at and before the checkpoint it resumed from (the steps it re-logs, else its last points
before the resume). Signatures (DESIGN.md section 4,
``state_not_restored`` and ``grad_scaling_bug``; Lightning #5400/#12274, HF transformers #7198, torchtitan
#1202, fairseq #3313 on state that was not reloaded):

- ``weights``: the loss is back near its initial level (at least ``back_frac``, 50%, of the way from the
  pre-resume loss to the first logged loss) with a continuous lr, or the parameter norm at the first step both
  processes logged differs by more than the updates in between can move it: the weights were not loaded;
- ``optimizer_state``: the update scale (``update_ratio``) is ``min_update_factor`` (1.5x) or more above the
  earlier process's, by at least ``spike_z`` (6) of its point-to-point noise sigmas, at the steps it re-logs
  (else against its last points before the resume, per unit lr), with the grad norm NOT up by a constant
  factor: Adam's moments restart from zero, so its first updates are lr x sign(g) per element (Kingma & Ba
  2015, section 2: the bias-corrected step is about lr when m and v hold one gradient), whether the jump then
  fades or stays; or a grad-norm or update-ratio spike (z >= ``spike_z`` against the pre-resume band) that
  fades within ``fade_points`` points; or a loss jump short of the initial level (above ``loss_jump_k_sigma``,
  6, noise sigmas and ``loss_jump_min_factor``, 1.15x);
- ``data_sampler``: the logged batch index does not continue the earlier process's, or the loss after the
  resume sits BELOW the earlier process's loss at the same steps by more than ``data_k_sigma`` (4) robust
  sigmas and ``data_min_factor`` (3%) (the data position went back and the model sees data it has already
  learned), or the re-logged steps differ from the earlier process's by as much as one batch differs from the
  next (rms of the log ratio >= ``rms_noise_frac``, half, of the loss's point-to-point noise, and ``rms_min``,
  1%): other batches at the same steps;
- ``grad_scaling_bug`` (``accumulation_scaling``): the grad norm jumps by a constant factor (>= ``min_factor``,
  2) at the resume and stays there, while the loss trend is unchanged: the loss is summed, not averaged, over
  micro-batches, or the accumulation factor changed.

Each signature has its confidence field (``weights_confidence`` ... ``loss_jump_confidence``); the windows on
either side of the resume are the fields of :class:`forensics.resume_rows.ResumeWindows`.

Evidence against each is stated: a discontinuous lr (then the lr explains the change), identical values at
re-logged steps (the state was restored), a jump inside the noise.

Rule: as above; docs/detectors.md#rs01 has it with its thresholds.
Source: docs/detectors.md#rs01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.resume_rows import (
    VSEG,
    LrIndex,
    ResumeRows,
    ResumeWindows,
    metric_jump,
    raw_rows,
    restarts_of,
    sigma_log,
    update_scale_jump,
)
from forensics.segment_index import SegmentIndex
from forensics.signals import SPIKE_Z

LR_FLOOR = 1e-30
"""Floor of the lr a relative lr change is divided by: guards an lr of zero, far below any real lr (ours)."""
PERCENT = 100
"""A loss ratio is shown per cent in a message (a unit, not a threshold)."""


@dataclass
class _Resume:
    """What one resume looks like in the loss (levels are loss values; ``sig``, ``jump``, ``thr`` in log)."""

    s0: int
    seg: int
    sig: float
    l_pre: float
    l_post: float
    l_init: float
    jump: float
    thr: float
    ratio: float | None
    rms: float | None
    ev: dict[str, object]
    rows: ResumeRows | None = None
    against: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ResumeState(Detector, ResumeWindows):
    """State not restored on resume (weights, optimizer moments, data position) and grad-scale changes.

    The windows on either side of a resume are the fields inherited from :class:`forensics.resume_rows.ResumeWindows`;
    the signatures' thresholds and confidences are below (all listed in docs/detectors.md#rs01 with their source).
    """

    code = "RS01"
    name = "resume.state"
    requires = ("loss",)
    back_frac: float = 0.5
    spike_z: float = SPIKE_Z
    min_update_factor: float = 1.5
    param_break_x: float = 10.0
    param_break_min_rel: float = 0.01
    param_delta_points: int = 10
    lr_tol: float = 0.05
    lr_tol_unrelogged: float = 0.1
    loss_jump_k_sigma: float = 6.0
    loss_jump_min_factor: float = 1.15
    data_k_sigma: float = 4.0
    data_min_factor: float = 1.03
    rms_noise_frac: float = 0.5
    rms_min: float = 0.01
    min_loss_points: int = 10
    initial_points: int = 3
    min_loss_before: int = 4
    min_batch_points: int = 6
    weights_confidence: float = 0.85
    param_break_confidence: float = 0.8
    scaling_confidence: float = 0.75
    update_confidence: float = 0.75
    spike_confidence: float = 0.7
    spike_confidence_loss_down: float = 0.6
    batch_confidence: float = 0.8
    data_confidence: float = 0.6
    loss_jump_confidence: float = 0.6

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding per resume.

        Each metric's rows are sorted and split at the (virtual) segments once (:class:`ResumeRows`): the
        earlier process is a prefix of the rows, the resumed one a slice.
        """
        rr = ResumeRows(run, restarts_of(run))
        if raw_rows(run, "loss", ("segment",)).height < self.min_loss_points:
            return []
        lr_index = LrIndex(rr.get("lr")[0])  # one index per run: each resume's lr lookup is a binary search
        rr.drop("lr")  # built again only if the update ratio needs it (memory: the loss rows come next)
        loss, idx = rr.get("loss")
        if loss.height < self.min_loss_points or idx.ids.size < 2:
            return []
        fv = loss.get_column("value").to_numpy()[idx.start[0]:idx.end[0]].astype(float)
        fv = fv[np.isfinite(fv)]
        if fv.size < self.initial_points:
            return []
        l_init = float(np.median(fv[: self.initial_points]))
        out: list[Finding] = []
        for j, b in enumerate(idx.ids[1:].tolist(), start=1):
            if idx.end[j] - idx.start[j] < self.head_points or idx.end[j - 1] < self.min_points_before:
                continue
            s0 = int(idx.steps[idx.start[j]])
            f = self._judge(rr, j, s0, b, l_init, lr_index)
            if f is not None:
                out.append(f)
        return out

    def _lr_continuous(self, lr_index: LrIndex, seg: int) -> bool | None:
        """Whether the first lr of virtual segment ``seg`` continues the earlier segments' (None: no lr to say)."""
        first = lr_index.first(seg)
        if first is None:
            return None
        st0, obs = first
        found = lr_index.before(seg, st0)
        if found is None:
            return None
        exp, exact = found
        tol = self.lr_tol if exact else max(self.lr_tol, self.lr_tol_unrelogged)
        return abs(obs - exp) <= tol * max(abs(exp), LR_FLOOR)

    def _judge(self, rr: ResumeRows, j: int, s0: int, seg: int, l_init: float, lr_index: LrIndex) -> Finding | None:
        """The first signature that the resume at ``s0`` (segment ``seg``, position ``j``) shows.

        In the order weights, gradients, data, loss; ``rr``: the run's rows, ``lr_index``: the lr's :class:`LrIndex`.
        """
        continuous = self._lr_continuous(lr_index, seg)
        if continuous is False:
            return None  # the lr changed at the resume: LR01 judges it, and it explains a loss change
        c = self._context(rr.get("loss"), j, s0, seg, l_init, continuous)
        if c is None:
            return None
        c.rows = rr
        if seg % VSEG:
            c.ev["restart"] = "wall-clock gap (the first logged step did not go back)"
        return (self._weights(c) or self._param_break(c) or self._gradients(c)
                or self._batch_position(c) or self._data(c) or self._loss_jump(c))

    def _context(self, loss: tuple[pl.DataFrame, SegmentIndex], j: int, s0: int, seg: int, l_init: float,
                 lr_continuous: bool | None) -> _Resume | None:
        """Loss levels before and after the resume, its noise, and the comparison at re-logged steps.

        ``loss``: its rows and index; the earlier process is the segments before position ``j``.
        """
        rows, idx = loss
        v = rows.get_column("value").to_numpy()
        pv = v[idx.before(j, s0, self.pre_points)].astype(float)
        pv = pv[np.isfinite(pv)]
        cur = rows.slice(int(idx.start[j]), int(idx.end[j] - idx.start[j]))
        cv = cur.get_column("value").to_numpy().astype(float)
        cv = cv[np.isfinite(cv)]
        if pv.size < self.min_loss_before or cv.size < self.head_points:
            return None
        sig = sigma_log(pv)
        l_pre, l_post = float(np.median(pv[-self.level_points:])), float(np.median(cv[: self.head_points]))
        jump = float(np.log(l_post / l_pre)) if l_pre > 0 and l_post > 0 else 0.0
        ev: dict[str, object] = {"resume_step": s0, "segment": seg // VSEG, "loss_before": l_pre, "loss_after": l_post,
                                 "initial_loss": l_init, "loss_noise_log": round(sig, 4),
                                 "lr_continuous": lr_continuous}
        # the re-logged steps: identical values say the state was restored
        overlap = rows[idx.from_step(j, s0)].join(cur.select("step", pl.col("value").alias("new")), on="step")
        ratio = rms = None
        if overlap.height >= 2:
            r = np.log(overlap.get_column("new").to_numpy() / overlap.get_column("value").to_numpy())
            r = r[np.isfinite(r)]
            if r.size >= 2:
                ratio, rms = float(np.median(r)), float(np.sqrt(np.mean(r * r)))
                ev.update(relogged_steps=int(overlap.height), relogged_log_ratio=round(ratio, 4),
                          relogged_rms_log_diff=round(rms, 4))
        thr = max(self.loss_jump_k_sigma * sig, float(np.log(self.loss_jump_min_factor)))
        return _Resume(s0, seg, sig, l_pre, l_post, l_init, jump, thr, ratio, rms, ev)

    def _weights(self, c: _Resume) -> Finding | None:
        """1. weights: the loss is back near its initial level."""
        if c.jump > c.thr and c.l_init > c.l_pre and (c.l_post - c.l_pre) >= self.back_frac * (c.l_init - c.l_pre):
            return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.WEIGHTS, self.weights_confidence,
                           f"at the resume at step {c.s0} the loss is back at {fmt(c.l_post)} (before {fmt(c.l_pre)}, "
                           f"first logged {fmt(c.l_init)}) while the lr continues: the weights were not loaded")
        return None

    def _param_break(self, c: _Resume) -> Finding | None:
        """1b. weights: the parameter norm at the first re-logged step is not the earlier process's.

        From a restored checkpoint both processes move the norm by about its usual per-step change, so at the
        first re-logged step, ``k`` steps after the last point before the resume, the norms agree to within a
        few ``k x delta`` (``delta`` the median per-step change of log norm over the last ``param_delta_points``
        (10) points; fresh Adam moments, 2-8x). A difference beyond ``param_break_x`` (10) ``k x delta`` and
        ``param_break_min_rel`` (1%) says other weights.
        """
        pn, idx = c.rows.get("param_norm")  # type: ignore[union-attr]
        if pn.height < self.min_metric_points:
            return None
        k, (lo, hi) = idx.position(c.seg), idx.rows(c.seg)
        cur = pn.slice(lo, hi - lo)
        before = pn[idx.before(k, c.s0, self.param_delta_points + 1)]
        ov = pn[idx.from_step(k, c.s0)].join(cur.select("step", pl.col("value").alias("new")),
                                              on="step").sort("step")
        if ov.height == 0 or before.height < self.min_points_before:
            return None
        st, old, new = int(ov.get_column("step")[0]), float(ov.get_column("value")[0]), float(ov.get_column("new")[0])
        bv, bs = before.get_column("value").to_numpy().astype(float), before.get_column("step").to_numpy()
        if not (old > 0 and new > 0 and np.all(bv > 0)):
            return None
        d = abs(float(np.log(new / old)))
        k = max(1, st - int(bs[-1]))
        delta = float(np.median(np.abs(np.diff(np.log(bv))) / np.maximum(np.diff(bs), 1)))
        if d < max(self.param_break_min_rel, self.param_break_x * k * delta):
            return None
        c.ev["param_norm_at_relogged_step"] = {"step": st, "before": old, "after": new,
                                               "per_step_change_log": round(delta, 6)}
        return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.WEIGHTS, self.param_break_confidence,
                       f"at step {st}, which both processes logged, the parameter norm is {fmt(new)} after the "
                       f"resume against {fmt(old)} before ({d:.1%}, {d / (k * delta):.0f}x what {k} "
                       "step(s) of training move it): the weights were not loaded")

    def _gradients(self, c: _Resume) -> Finding | None:
        """2. grad norm and update scale: a constant factor (scaling), an update jump or a fading spike (moments)."""
        rr = c.rows
        assert rr is not None
        gn = metric_jump(rr, "grad_norm", c.s0, c.seg, self)
        up = metric_jump(rr, "update_ratio", c.s0, c.seg, self)
        if gn is not None:
            c.ev["grad_norm_jump"] = gn
        if up is not None:
            c.ev["update_ratio_jump"] = up
        gn_const = gn is not None and gn["stays"] and gn["factor"] >= self.min_factor
        if gn_const and abs(c.jump) <= c.thr:
            return self._f(c, Cause.GRAD_SCALING_BUG, Mechanism.ACCUMULATION_SCALING, self.scaling_confidence,
                           f"from the resume at step {c.s0} the grad norm is {gn['factor']:.3g}x its earlier level and "
                           f"stays there while the loss continues its trend ({fmt(c.l_pre)} -> {fmt(c.l_post)}): the "
                           "gradients are scaled by a constant (loss summed over micro-batches, or the accumulation "
                           "factor changed)")
        us = update_scale_jump(rr, c.s0, c.seg, self)
        if us is not None:
            c.ev["update_scale_jump"] = us
            if us["factor"] >= self.min_update_factor and us["z"] >= self.spike_z and not gn_const:
                where = "at the steps it re-logs" if us["relogged"] else "per unit lr, against its last points"
                return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.OPTIMIZER_STATE, self.update_confidence,
                               f"from the resume at step {c.s0} the update ratio is {us['factor']:.3g}x the earlier "
                               f"process's {where} ({us['z']:.0f} noise sigmas), with a continuous lr and no constant "
                               "change of the grad norm: the optimizer moments restarted from zero (fresh Adam "
                               "moments step by about lr x sign(g)): optimizer state not restored")
        spikes = [(m, j) for m, j in (("grad_norm", gn), ("update_ratio", up))
                  if j is not None and j["z"] >= self.spike_z and not j["stays"]]
        if spikes:
            m, j = spikes[0]
            return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.OPTIMIZER_STATE,
                           self.spike_confidence if c.jump > 0 else self.spike_confidence_loss_down,
                           f"right after the resume at step {c.s0} the {m} spikes to {j['factor']:.3g}x its earlier "
                           f"level (z={j['z']:.1f}) and fades, with a continuous lr: the optimizer moments restarted "
                           "(state not restored)")
        return None

    def _batch_position(self, c: _Resume) -> Finding | None:
        """3a. the data position, when the batch index is logged: the resumed process does not continue it.

        At a re-logged step the index must equal the earlier process's; else the first point after the resume
        must be the last one before it plus the steps in between (one batch per step).
        """
        bi, idx = c.rows.get("batch_index")  # type: ignore[union-attr]
        if bi.height < self.min_batch_points:
            return None
        k, (lo, hi) = idx.position(c.seg), idx.rows(c.seg)
        cur = bi.slice(lo, hi - lo)
        before = bi[idx.before(k, c.s0, 2)]
        if cur.height == 0 or before.height < 2:
            return None
        st, got = int(cur.get_column("step")[0]), float(cur.get_column("value")[0])
        same = bi[idx.from_step(k, st)].filter(pl.col("step") == st)
        if same.height:
            exp = float(same.get_column("value")[-1])
        else:
            exp = float(before.get_column("value")[-1]) + st - int(before.get_column("step")[-1])
        if abs(got - exp) < 1:
            return None
        c.ev["batch_index_after_resume"] = {"step": st, "logged": got, "expected": exp}
        return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.DATA_SAMPLER, self.batch_confidence,
                       f"at step {st} the resumed process logs batch index {got:.0f} where the earlier process's "
                       f"position gives {exp:.0f}: the data position was not restored (data-sampler state)")

    def _data(self, c: _Resume) -> Finding | None:
        """3. the data position: a loss too good, or other batches, at the re-logged steps."""
        # (only at re-logged steps: without them a falling loss looks "better" after any resume)
        low = c.ratio if c.ratio is not None else 0.0
        if low < -max(self.data_k_sigma * c.sig, float(np.log(self.data_min_factor))):
            drop = PERCENT * (1 - np.exp(low))
            return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.DATA_SAMPLER, self.data_confidence,
                           f"after the resume at step {c.s0} the loss is {fmt(drop)}% lower than "
                           "the earlier process at the same steps: the data position went back and the model sees "
                           "data it has already learned (sampler state not restored)")
        # the re-logged steps disagree by as much as one batch differs from the next: the resumed process sees
        # other batches at the same steps; a restored state re-logs the same values up to kernel non-determinism
        if (c.rms is not None and c.ratio is not None and abs(c.ratio) <= c.thr
                and c.rms >= max(self.rms_noise_frac * c.sig * np.sqrt(2), self.rms_min)):
            return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.DATA_SAMPLER, self.data_confidence,
                           f"the steps the resumed process re-logs from step {c.s0} differ from the earlier process's "
                           f"by {c.rms:.1%} (rms), as much as one batch differs from the next, with a "
                           "continuous lr: it sees other batches at the same steps (data-sampler state not restored)")
        return None

    def _loss_jump(self, c: _Resume) -> Finding | None:
        """4. a loss jump short of the initial level."""
        if c.jump > c.thr and (c.ratio is None or c.ratio > c.thr):
            return self._f(c, Cause.STATE_NOT_RESTORED, Mechanism.OPTIMIZER_STATE, self.loss_jump_confidence,
                           f"at the resume at step {c.s0} the loss jumps from {fmt(c.l_pre)} to {fmt(c.l_post)} "
                           f"({c.jump / c.sig:.0f} noise sigmas) with a continuous lr: part of the training state was "
                           "not restored")
        return None

    def _f(self, c: _Resume, cause: Cause, mech: Mechanism, conf: float, msg: str) -> Finding:
        return self.finding(cause=cause, mechanism=mech, step=c.s0, segment=c.seg // VSEG, confidence=conf,
                            severity=Severity.HIGH, message=msg + ".", evidence=c.ev, against=tuple(c.against))
