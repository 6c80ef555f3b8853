"""DB01 data.bad_batch: a loss spike or NaN with no precursor, i.e. the data, not the optimizer.

Rule (docs/detectors.md#db01; PaLM, arXiv 2204.02311 section 5.1; OLMo 2, arXiv 2501.00656): a loss
departure whose excursion starts abruptly (within ``max_rise_steps`` of its detection) with no
grad-norm spike (z >= 6) in the ``window`` steps before it and no grad-norm excursion (z >= 3)
in the ``lead_steps`` (5) steps before it (grad norm leads the loss by 1-4 steps: BLOOM tr11).
The batch is named when ``batch_index`` is logged. A finite blow-up that never recovers while the lr is
still warming up is left to the warm-up rule (WU01): the step size, not a batch. A spike that
recovers by itself is reported with ``recovered_step`` (the engine calls the run transient if nothing else fires).

Source: docs/detectors.md#db01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.facts import RunFacts, run_facts
from forensics.growth_precursor import growth_before, growth_metrics
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.signals import MIN_WINDOW_POINTS, ONSET_Z, SPIKE_Z, WINDOW, departures, scaler_skips, zscores


@dataclass(frozen=True)
class BadBatch(Detector):
    """Abrupt loss departures without a precursor in grad norm or update scale."""

    code = "DB01"
    name = "data.bad_batch"
    uses_facts = True
    requires = ("loss",)
    window: int = WINDOW
    max_rise_steps: int = 2
    precursor_z: float = ONSET_Z
    lead_steps: int = 5
    max_departures: int = 5
    max_findings: int = 3
    named_series: int = 3
    confidence: float = 0.75
    confidence_no_grad_norm: float = 0.55
    confidence_in_warmup: float = 0.5
    warmup_min_points: int = 4
    warmup_peak_frac: float = 0.95
    warmup_start_frac: float = 0.5
    corise_points: int = 6
    corise_frac: float = 0.8

    def detect(self, run: RunData, facts: RunFacts | None = None) -> list[Finding]:
        """One finding per precursor-free loss departure (at most ``max_findings``, of ``max_departures``)."""
        s = run.series("loss")
        out: list[Finding] = []
        g = zscores(run, "grad_norm")
        fp16 = bool((facts or run_facts(run)).fp16)
        resumes = set(s.steps[np.flatnonzero(np.diff(s.segments) != 0) + 1].tolist()) if s else set()
        for d in departures(run, "loss", limit=self.max_departures):
            if d.index - d.onset_index > self.max_rise_steps:
                continue  # a slow build-up is not a bad batch
            if d.onset_step in resumes:
                continue  # a jump at the first step of a resumed process is the resume's (RS01, LR01 judge it)
            pre_lo = max(d.onset_step - self.window, int(s.steps[0]))
            if int(np.sum(np.isfinite(s.values[(s.steps >= pre_lo) & (s.steps < d.onset_step)]))) < MIN_WINDOW_POINTS:
                continue  # no finite history before it: nothing to call the batch abnormal against (NF02's case)
            against = self._precursors(run, g, d.onset_step)
            if d.nonfinite and fp16:
                if run.has("loss_scale") or g is None:
                    continue  # a non-finite loss in an fp16 run is an overflow first (OV01/OV02 judge it)
            if against:
                continue
            if self._co_rise(run, s, d.onset_step):
                continue  # loss (and grad norm) rising step after step: an optimisation divergence, not one batch
            in_warmup = self._in_warmup(run, d.onset_step)
            if in_warmup and d.recovered_step is None and not d.nonfinite:
                # a finite blow-up that never recovers while the lr still ramps up: the step size, not a batch
                continue
            ev: dict[str, object] = {"spike_step": d.step, "onset_step": d.onset_step, "loss": d.value,
                                     "trailing_median": d.baseline, "z": d.z, "nonfinite": d.nonfinite,
                                     "recovered_step": d.recovered_step, "precursor_window": [pre_lo, d.onset_step - 1],
                                     "grad_norm_logged": g is not None}
            bi = run.series("batch_index")
            named = ""
            if bi is not None:
                k = np.flatnonzero(bi.steps == d.onset_step)
                if k.size and np.isfinite(bi.values[k[0]]):
                    ev["batch_index"] = int(bi.values[k[0]])
                    named = f"; batch index {int(bi.values[k[0]])}"
            conf = self.confidence if g is not None else self.confidence_no_grad_norm
            warm_against: tuple[str, ...] = ()
            if in_warmup:  # a spike while the lr still ramps up is first the warm-up's (WU01)
                conf = min(conf, self.confidence_in_warmup)
                warm_against = ("the spike comes while the lr is still warming up: the lr ramp is the first "
                                "suspect",)
            what = "NaN loss" if d.nonfinite else f"loss {fmt(d.value)} vs trailing median {fmt(d.baseline)}"
            out.append(self.finding(
                cause=Cause.DATA_BATCH, mechanism=Mechanism.BAD_BATCH, step=d.onset_step,
                segment=segment_at(s, d.onset_step),
                confidence=conf, severity=Severity.HIGH,
                message=f"abrupt {what} at step {d.step} with no precursor in {self._checked(run, g)} over steps "
            f"{pre_lo}..{d.onset_step - 1}{named}.",
                evidence=ev,
                against=warm_against + (() if g is not None else
                                        ("grad norm not logged: a precursor cannot be ruled out",)),
            ))
            if len(out) >= self.max_findings:
                break
        return out

    def _co_rise(self, run: RunData, s, onset: int) -> bool:  # noqa: ANN001
        """True when the loss keeps rising for ``corise_points`` logged points from ``onset``.

        At least ``corise_frac`` of the steps up, all finite, and so does the grad norm where it is logged (user
        test U5: a bad batch is a one-step event; a monotone multi-step co-rise is the optimiser's).
        """
        def rising(series) -> bool:  # noqa: ANN001
            v = series.values[series.steps >= onset][:self.corise_points]
            return bool(v.size == self.corise_points and np.all(np.isfinite(v))
                        and np.mean(np.diff(v) > 0) >= self.corise_frac)
        gn = run.series("grad_norm")
        return rising(s) and (gn is None or rising(gn))

    def _checked(self, run: RunData, g: tuple | None) -> str:
        """The series the precursor check read, in words."""
        grown = growth_metrics(run)
        names = (["the grad norm"] if g is not None else []) + grown[:self.named_series]
        more = len(grown) - self.named_series
        return ("the loss itself (no grad norm or growth series logged)" if not names
                else ", ".join(names) + (f" and {more} more" if more > 0 else ""))

    def _precursors(self, run: RunData, g: tuple | None, onset: int) -> list[str]:
        """What before ``onset`` is a precursor; [] if none.

        A grad-norm departure or non-finite grad norms, or a growth series (activations, update ratio, logits,
        weights: :mod:`forensics.growth_precursor`).
        """
        grown = growth_before(run, onset, self.window, self.lead_steps)
        against: list[str] = [] if grown is None else [
            f"{grown.metric} already grew from {fmt(grown.base)} to {fmt(grown.value)} from step {grown.onset_step} "
            "(a precursor)"]
        if g is None:
            return against
        gs, _, gz, _ = g
        m = (gs.steps >= onset - self.window) & (gs.steps < onset)
        gzm = np.where(np.isfinite(gz[m]), gz[m], -np.inf)
        near = (gs.steps[m] >= onset - self.lead_steps)
        hit = (gzm >= SPIKE_Z) | (near & (gzm >= self.precursor_z))
        if hit.any():
            k = int(np.flatnonzero(hit)[0])
            against.append(f"grad norm already departed at step {int(gs.steps[m][k])} (a precursor)")
        gv = gs.values[m]
        sk = scaler_skips(run, gs)
        if sk is not None:  # an fp16 scaler's overflow checks are not a precursor
            gv = gv[~sk[m]]
        if gv.size and not np.all(np.isfinite(gv)):
            against.append("non-finite grad norms before the spike")
        return against

    def _in_warmup(self, run: RunData, step: int) -> bool:
        """True when the lr at ``step`` is still rising toward a later, higher peak.

        Below ``warmup_peak_frac`` (95%) of the peak, in a schedule that started below ``warmup_start_frac``
        (half) of it, with at least ``warmup_min_points`` logged lr values.
        """
        lr = run.series("lr")
        if lr is None or len(lr) < self.warmup_min_points:
            return False
        v = np.where(np.isfinite(lr.values), lr.values, np.nan)
        if not np.isfinite(v).any():
            return False
        i_peak = int(np.nanargmax(v))
        k = int(np.searchsorted(lr.steps, step))
        if k >= len(v) or k >= i_peak:
            return False
        peak = v[i_peak]
        return bool(np.isfinite(v[k]) and v[k] < self.warmup_peak_frac * peak and v[0] < self.warmup_start_frac * peak)
