"""RS01 resume.state: what the loss, grad norm and update scale say about each resume.

At every resume (a new segment) whose lr continues the earlier schedule (LR01 judges the lr), the first
logged points of the new process are compared with the earlier process at and before the checkpoint it
resumed from (the steps it re-logs, else its last points before the resume). Signatures (DESIGN.md section 4,
``state_not_restored`` and ``grad_scaling_bug``; Lightning #5400/#12274, HF transformers #7198, torchtitan
#1202, fairseq #3313 on state that was not reloaded):

- ``weights``: the loss is back near its initial level (at least ``back_frac``, 50%, of the way from the
  pre-resume loss to the first logged loss) with a continuous lr: the weights were not loaded;
- ``optimizer_state``: a grad-norm or update-ratio spike (z >= 6 against the pre-resume band) in the first
  points after the resume that fades within ``fade_points`` points, or a loss jump short of the initial level:
  Adam's moments restart from zero (the first updates are lr x sign(g)) or the optimizer state was not loaded;
- ``data_sampler``: the loss after the resume sits BELOW the earlier process's loss at the same steps by more
  than 4 robust sigmas (the data position went back and the model sees data it has already learned), or the
  re-logged steps differ from the earlier process's by as much as one batch differs from the next (rms of
  the log ratio >= half the loss's point-to-point noise): other batches at the same steps;
- ``grad_scaling_bug`` (``accumulation_scaling``): the grad norm jumps by a constant factor (>= 2) at the
  resume and stays there, while the loss trend is unchanged: the loss is summed, not averaged, over
  micro-batches, or the accumulation factor changed.

Evidence against each is stated: a discontinuous lr (then the lr explains the change), identical values at
re-logged steps (the state was restored), a jump inside the noise.

Rule: as above; docs/detectors.md#rs01 has it with its thresholds.
Source: docs/detectors.md#rs01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt
from forensics.model import Finding, RunData


def _rows(run: RunData, metric: str) -> pl.DataFrame:
    """Rows of ``metric`` from the source its effective series comes from (all segments), sorted by segment, step."""
    s = run.series(metric)
    if s is None:
        return pl.DataFrame()
    raw = run.raw(metric).filter(pl.col("value").is_not_null())
    groups = run.meta.get("source_groups", {})
    group = groups.get(s.source)
    members = [p for p, g in groups.items() if g == group] if group else [s.source]
    return raw.filter(pl.col("source").is_in(members)).sort(["segment", "step"], maintain_order=True)


def _sigma_log(v: np.ndarray) -> float:
    """Robust point-to-point noise of log values (1.4826 MAD of first differences / sqrt 2)."""
    v = v[np.isfinite(v) & (v > 0)]
    if v.size < 6:
        return 0.05
    d = np.diff(np.log(v))
    return max(1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2), 1e-3)


@dataclass(frozen=True)
class ResumeState(Detector):
    """State not restored on resume (weights, optimizer moments, data position) and grad-scale changes."""

    code = "RS01"
    name = "resume.state"
    requires = ("loss",)
    back_frac: float = 0.5
    spike_z: float = 6.0
    fade_points: int = 20
    min_factor: float = 2.0
    lr_tol: float = 0.05

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding per resume."""
        loss = _rows(run, "loss")
        if loss.height < 10:
            return []
        segs = sorted(set(loss.get_column("segment").to_list()))
        if len(segs) < 2:
            return []
        lr = _rows(run, "lr")
        first = loss.filter(pl.col("segment") == segs[0])
        fv = first.get_column("value").to_numpy().astype(float)
        fv = fv[np.isfinite(fv)]
        if fv.size < 3:
            return []
        l_init = float(np.median(fv[:3]))
        out: list[Finding] = []
        for a, b in zip(segs, segs[1:], strict=False):
            prev = loss.filter(pl.col("segment") <= a)
            cur = loss.filter(pl.col("segment") == b)
            if cur.height < 3 or prev.height < 6:
                continue
            s0 = int(cur.get_column("step")[0])
            f = self._judge(run, prev, cur, s0, b, l_init, lr)
            if f is not None:
                out.append(f)
        return out

    def _lr_continuous(self, lr: pl.DataFrame, a_rows: pl.DataFrame, s0: int, seg: int) -> bool | None:
        if lr.height == 0:
            return None
        cur = lr.filter(pl.col("segment") == seg).sort("step")
        prev = lr.filter(pl.col("segment") < seg).sort("step")
        if cur.height == 0 or prev.height == 0:
            return None
        obs = float(cur.get_column("value")[0])
        st0 = int(cur.get_column("step")[0])
        same = prev.filter(pl.col("step") == st0)
        if same.height:
            exp = float(same.get_column("value")[-1])
        else:
            before = prev.filter(pl.col("step") < st0).tail(2)
            if before.height == 0:
                return None
            exp = float(before.get_column("value")[-1])
            tol = max(self.lr_tol, 0.1)
            return abs(obs - exp) <= tol * max(abs(exp), 1e-30)
        return abs(obs - exp) <= self.lr_tol * max(abs(exp), 1e-30)

    def _judge(self, run: RunData, prev: pl.DataFrame, cur: pl.DataFrame, s0: int, seg: int, l_init: float,
               lr: pl.DataFrame) -> Finding | None:
        pre = prev.filter(pl.col("step") < s0)
        pv = pre.get_column("value").to_numpy().astype(float)[-30:]
        pv = pv[np.isfinite(pv)]
        cv_all = cur.get_column("value").to_numpy().astype(float)
        cv = cv_all[np.isfinite(cv_all)]
        if pv.size < 4 or cv.size < 3:
            return None
        sig = _sigma_log(pv)
        l_pre = float(np.median(pv[-5:]))
        k = min(3, cv.size)
        l_post = float(np.median(cv[:k]))
        jump = float(np.log(l_post / l_pre)) if l_pre > 0 and l_post > 0 else 0.0
        cont = self._lr_continuous(lr, prev, s0, seg)
        ev: dict[str, object] = {"resume_step": s0, "segment": seg, "loss_before": l_pre, "loss_after": l_post,
                                 "initial_loss": l_init, "loss_noise_log": round(sig, 4), "lr_continuous": cont}
        against: list[str] = []
        if cont is False:
            return None  # the lr changed at the resume: LR01 judges it, and it explains a loss change
        # the re-logged steps: identical values say the state was restored
        overlap = prev.filter(pl.col("step") >= s0).join(cur.select("step", pl.col("value").alias("new")),
                                                          on="step")
        ratio = None
        rms = None
        if overlap.height >= 2:
            r = np.log(overlap.get_column("new").to_numpy() / overlap.get_column("value").to_numpy())
            r = r[np.isfinite(r)]
            if r.size >= 2:
                ratio = float(np.median(r))
                rms = float(np.sqrt(np.mean(r * r)))
                ev["relogged_steps"] = int(overlap.height)
                ev["relogged_log_ratio"] = round(ratio, 4)
                ev["relogged_rms_log_diff"] = round(rms, 4)
        thr = max(6 * sig, float(np.log(1.15)))
        # 1. weights: back near the initial loss
        if jump > thr and l_init > l_pre and (l_post - l_pre) >= self.back_frac * (l_init - l_pre):
            return self._f(seg, s0, "state_not_restored", "weights", 0.85, ev,
                           f"at the resume at step {s0} the loss is back at {fmt(l_post)} (before {fmt(l_pre)}, "
                           f"first logged {fmt(l_init)}) while the lr continues: the weights were not loaded",
                           against)
        # 2. grad norm: a constant factor that stays (scaling) or a spike that fades (optimizer moments)
        gn = self._jump(run, "grad_norm", s0, seg)
        up = self._jump(run, "update_ratio", s0, seg)
        if gn is not None:
            ev["grad_norm_jump"] = gn
        if up is not None:
            ev["update_ratio_jump"] = up
        if gn is not None and gn["stays"] and gn["factor"] >= self.min_factor and abs(jump) <= thr:
            return self._f(seg, s0, "grad_scaling_bug", "accumulation_scaling", 0.75, ev,
                           f"from the resume at step {s0} the grad norm is {gn['factor']:.3g}x its earlier level and "
                           f"stays there while the loss continues its trend ({fmt(l_pre)} -> {fmt(l_post)}): the "
                           "gradients are scaled by a constant (loss summed over micro-batches, or the accumulation "
                           "factor changed)", against)
        spikes = [(m, j) for m, j in (("grad_norm", gn), ("update_ratio", up))
                  if j is not None and j["z"] >= self.spike_z and not j["stays"]]
        if spikes:
            m, j = spikes[0]
            return self._f(seg, s0, "state_not_restored", "optimizer_state", 0.7 if jump > 0 else 0.6, ev,
                           f"right after the resume at step {s0} the {m} spikes to {j['factor']:.3g}x its earlier "
                           f"level (z={j['z']:.1f}) and fades, with a continuous lr: the optimizer moments restarted "
                           "(state not restored)", against)
        # 3. the loss too good: replayed data
        # (only at re-logged steps: without them a falling loss looks "better" after any resume)
        low = ratio if ratio is not None else 0.0
        if low < -max(4 * sig, float(np.log(1.03))):
            return self._f(seg, s0, "state_not_restored", "data_sampler", 0.6, ev,
                           f"after the resume at step {s0} the loss is {fmt(100 * (1 - np.exp(low)))}% lower than the "
                           "earlier process at the same steps: the data position went back and the model sees "
                           "data it has already learned (sampler state not restored)", against)
        # 3b. the re-logged steps disagree by as much as one batch differs from the next: the resumed process
        # sees other batches at the same steps (the data position was not restored); a restored state re-logs
        # the same values up to kernel non-determinism
        if rms is not None and ratio is not None and abs(ratio) <= thr and rms >= max(0.5 * sig * np.sqrt(2), 0.01):
            return self._f(seg, s0, "state_not_restored", "data_sampler", 0.6, ev,
                           f"the steps the resumed process re-logs from step {s0} differ from the earlier process's "
                           f"by {100 * rms:.1f}% (rms), as much as one batch differs from the next, with a continuous "
                           "lr: it sees other batches at the same steps (data-sampler state not restored)", against)
        # 4. a loss jump short of the initial level
        if jump > thr and (ratio is None or ratio > thr):
            return self._f(seg, s0, "state_not_restored", "optimizer_state", 0.6, ev,
                           f"at the resume at step {s0} the loss jumps from {fmt(l_pre)} to {fmt(l_post)} "
                           f"({jump / sig:.0f} noise sigmas) with a continuous lr: part of the training state was not "
                           "restored", against)
        return None

    def _jump(self, run: RunData, metric: str, s0: int, seg: int) -> dict[str, float | bool] | None:
        rows = _rows(run, metric)
        if rows.height < 8:
            return None
        pre = rows.filter((pl.col("segment") < seg) & (pl.col("step") < s0)).get_column("value").to_numpy()
        post = rows.filter(pl.col("segment") == seg).get_column("value").to_numpy()
        pre = pre[np.isfinite(pre) & (pre > 0)][-30:]
        post = post[np.isfinite(post) & (post > 0)]
        if pre.size < 5 or post.size < 3:
            return None
        lp = np.log(pre)
        med = float(np.median(lp))
        sig = max(1.4826 * float(np.median(np.abs(lp - med))), 0.02)
        head = np.log(post[:3])
        z = float((head.max() - med) / sig)
        tail = post[3:3 + self.fade_points]
        level = float(np.median(np.log(post[: min(post.size, self.fade_points)])))
        factor = float(np.exp(level - med))
        stays = bool(tail.size >= 5 and np.median(np.log(tail)) - med >= np.log(self.min_factor)
                     and float(np.std(np.log(tail))) <= 3 * sig + 0.2)
        return {"z": round(z, 2), "factor": round(float(np.exp(head.max() - med)) if not stays else factor, 3),
                "stays": stays}

    def _f(self, seg: int, s0: int, cause: str, mech: str, conf: float, ev: dict[str, object], msg: str,
           against: list[str]) -> Finding:
        return self.finding(cause=cause, mechanism=mech, step=s0, segment=seg, confidence=conf, severity="high",
                            message=msg + ".", evidence=ev, against=tuple(against))
