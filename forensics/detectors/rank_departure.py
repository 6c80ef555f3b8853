"""RK01 rank.departure: one rank (a minority) leaves the other ranks of the same job: its device or data shard.

Rule (docs/detectors.md#rk01): the ranks of one data-parallel job train the same weights at the same lr, so their
losses (and local grad norms) differ only by their shards' batch noise. When a run's logs come from two or more
ranks (``RunData.ranks``: per-rank files, rank-prefixed lines), each rank's log loss and log grad norm are compared
at every step all ranks logged with the ranks' median there. Its gap ``d`` has a noise ``sigma`` estimated from the
gap's successive differences (``1.4826 * MAD(diff d) / sqrt 2``: a level shift or a drift moves one difference,
not the spread); the gap is centred on its own early level (a shard that always runs a little higher is no fault)
and smoothed by a trailing median of ``smooth`` points. A rank departs where the smoothed gap leaves the band
``max(k_sigma * sigma_smoothed, log(1 + min_rel))`` for ``min_run`` points in a row; the onset is walked back over
the raw points still ``onset_k_sigma`` sigmas out. A rank whose loss is non-finite while the others are finite
departs at that step. It is one bad rank only when

* fewer than half the ranks depart (with two ranks: the one that leaves its own level, see below), and
* the others agree with each other and stay healthy: over ``window`` points before and after the onset their
  median moves by at most ``others_ratio`` of how far the departing rank moves away from them (for a non-finite
  rank: by less than ``log(1 + others_rel)``, and they are finite at that step). Ranks that diverge together
  (an lr too high) fail this test: that is the run's problem, not a rank's.

The loss decides when every rank logs it; a grad norm alone does not name a rank (a ZeRO partition's norm may
drift on its own, an fp16 overflow on one rank's shard is routine) but moves the onset of a rank whose loss departs
up to ``window`` points earlier (the grad norm leads the loss). Without per-rank losses the grad norm decides.

With two ranks there is no majority; the rank whose own level moves (the other's stays) is named, at a lower
confidence. Findings carry the rank, the agreeing ranks, the series, the gap and the onset.

Source: docs/detectors.md#rk01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.stats import MAD_TO_SIGMA

SERIES = ("loss", "grad_norm")
"""The series compared across ranks, in the order they are judged (the objective first)."""
MAJORITY_RANKS = 3
"""Fewest ranks with a majority that can outvote one departing rank (with two, neither is the majority)."""
MEDIAN_EFFICIENCY = float(np.sqrt(np.pi / 2))
"""Noise of a median of k normal points: sigma * sqrt(pi / (2 k)) (the median's asymptotic efficiency)."""


@dataclass(frozen=True)
class Departure:
    """One rank leaving the others: its series, onset index and step, the gap there and at the end."""

    rank: int
    metric: str
    index: int
    step: int
    gap: float
    own_move: float
    others_move: float
    nonfinite: bool


@dataclass(frozen=True)
class RankDeparture(Detector):
    """A minority rank whose loss or grad norm leaves the other ranks' while they agree."""

    code = "RK01"
    name = "rank.departure"
    needs = "per-rank values of loss or grad_norm from two or more ranks (per-rank files, rank-prefixed lines)"
    min_points: int = 30
    baseline_frac: float = 0.25
    smooth: int = 9
    k_sigma: float = 5.0
    min_rel: float = 0.2
    min_run: int = 18
    onset_k_sigma: float = 3.0
    sigma_floor: float = 0.01
    window: int = 30
    others_ratio: float = 0.5
    others_rel: float = 0.5
    confidence: float = 0.85
    two_ranks_confidence: float = 0.6

    def missing(self, run: RunData, facts: object = None) -> str | None:
        """Needs per-rank values of loss or grad_norm from two or more ranks."""
        r = run.ranks
        if r.height == 0 or r.get_column("rank").n_unique() < 2:
            return "needs per-rank values from two or more ranks (per-rank files or rank-prefixed lines)"
        return None

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding per departing rank.

        The loss decides when every rank logs it: a grad norm alone (a partition's norm may drift on its own, an
        fp16 overflow on one rank's shard is routine) only moves the onset earlier, by at most ``window`` points,
        for a rank whose loss departs too. Without per-rank losses the grad norm decides.
        """
        if run.ranks.height == 0:
            return []
        table = _effective(run.ranks)
        found: dict[str, dict[int, Departure]] = {}
        wides: dict[str, tuple[np.ndarray, np.ndarray, list[int]]] = {}
        for metric in SERIES:
            wide = _wide(table, metric)
            if wide is None or wide[1].shape[0] < self.min_points:
                continue
            wides[metric] = wide
            found[metric] = {d.rank: d for d in self._departures(metric, *wide)}
        if not wides:
            return []
        lead, rest = (SERIES[0], SERIES[1:]) if SERIES[0] in wides else (next(iter(wides)), ())
        steps, _, ranks = wides[lead]
        out = []
        for rank, d in found[lead].items():
            for metric in rest:
                g = found.get(metric, {}).get(rank)
                if g is not None and g.step < d.step and d.index - np.searchsorted(steps, g.step) <= self.window:
                    d = g  # the grad norm leads the loss by a few steps (BLOOM tr11 chronicles)
            out.append(self._finding(run, d, [r for r in ranks if r not in found[lead]], len(ranks)))
        return out

    # -- the comparison ------------------------------------------------------------------------
    def _departures(self, metric: str, steps: np.ndarray, x: np.ndarray, ranks: list[int]) -> list[Departure]:
        n = len(ranks)
        with np.errstate(divide="ignore", invalid="ignore"):
            lx = np.where(np.isfinite(x) & (x > 0), np.log(x), np.nan)
        bad_value = ~np.isfinite(x)  # NaN or inf as logged (a rank's non-finite loss)
        with np.errstate(all="ignore"):
            ref = np.nanmedian(lx, axis=1)
        cand = {}
        for j in range(n):
            hit = self._band_departure(lx[:, j] - ref)
            nf = self._nonfinite_start(bad_value, j)
            if nf is not None and (hit is None or nf <= hit):
                cand[j] = (nf, True)
            elif hit is not None:
                cand[j] = (hit, False)
        if not cand or (n >= MAJORITY_RANKS and len(cand) >= n / 2):
            return []  # nothing departs, or half the ranks or more do: the run, not one rank
        out = []
        for j, (i, nonfinite) in cand.items():
            others = [k for k in range(n) if k != j and k not in cand] or [k for k in range(n) if k != j]
            with np.errstate(all="ignore"):
                o = np.nanmedian(lx[:, others], axis=1)
            own_move, others_move = _move(lx[:, j], i, self.window), _move(o, i, self.window)
            if nonfinite:
                ok = bool(np.isfinite(x[i, others]).all()) and np.isfinite(others_move) and \
                    abs(others_move) <= np.log1p(self.others_rel) and _mostly_finite(x[i:i + self.window, others])
            else:
                ok = np.isfinite(own_move) and np.isfinite(others_move) and \
                    abs(others_move) <= self.others_ratio * abs(own_move - others_move)
            if ok:
                gap = float(lx[i, j] - ref[i]) if np.isfinite(lx[i, j]) else float("nan")
                out.append(Departure(ranks[j], metric, i, int(steps[i]), gap, own_move, others_move, nonfinite))
        return out

    def _band_departure(self, d: np.ndarray) -> int | None:
        """Onset index of a persistent departure of the gap ``d`` from its early level, else None."""
        fin = np.isfinite(d)
        if fin.sum() < self.min_points:
            return None
        df = d[fin]
        diffs = np.diff(df)
        sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(diffs - np.median(diffs)))) / np.sqrt(2), self.sigma_floor)
        base = df[:max(self.min_points // 2, int(len(df) * self.baseline_frac))]
        centred = np.where(fin, d - float(np.median(base)), np.nan)
        sm = pl.Series(centred).fill_nan(None).rolling_median(
            self.smooth, min_samples=self.smooth // 2 + 1).to_numpy()
        sigma_sm = sigma * MEDIAN_EFFICIENCY / np.sqrt(self.smooth)
        band = max(self.k_sigma * sigma_sm, float(np.log1p(self.min_rel)))
        out = np.nan_to_num(np.abs(sm), nan=0.0) > band
        run_len = _run_lengths(out)
        hits = np.flatnonzero(run_len >= self.min_run)
        if hits.size == 0:
            return None
        i = int(hits[0]) - self.min_run + 1  # the first point of the first long enough run
        sign = np.sign(sm[i])
        lo = max(0, i - self.smooth)
        while i - 1 >= lo and np.isfinite(centred[i - 1]) and \
                sign * centred[i - 1] > self.onset_k_sigma * sigma:  # walk back over raw points still out
            i -= 1
        return i

    def _nonfinite_start(self, bad: np.ndarray, j: int) -> int | None:
        """First index where rank ``j`` logged a non-finite value while most other ranks logged finite ones."""
        others = np.delete(bad, j, axis=1)
        mask = bad[:, j] & (others.sum(axis=1) < others.shape[1] / 2)
        hit = np.flatnonzero(mask)
        return int(hit[0]) if hit.size else None

    # -- the finding -----------------------------------------------------------------------------
    def _finding(self, run: RunData, d: Departure, agree: list[int], n_ranks: int) -> Finding:
        two = n_ranks < MAJORITY_RANKS
        rel = float(np.exp(d.own_move - d.others_move))
        what = (f"its {d.metric} is non-finite at step {d.step} while the other ranks' is finite" if d.nonfinite
                else f"its {d.metric} leaves the ranks' median at step {d.step} (x{rel:.3g} against the others "
                     f"over the next {self.window} points)")
        others = ", ".join(map(str, agree)) or "none"
        message = (f"rank {d.rank} departs from the other ranks of the job: {what}; rank(s) {others} at the same lr "
                   "agree with each other and stay healthy: one bad rank (its device or its data shard), not the "
                   "optimisation" + (" (two ranks: named as the one that left its own level)" if two else "") + ".")
        seg = self._segment(run, d.step)
        return self.finding(
            cause=Cause.HARDWARE_OR_DISTRIBUTED, mechanism=Mechanism.BAD_RANK, step=d.step, segment=seg,
            confidence=self.two_ranks_confidence if two else self.confidence, severity=Severity.CRITICAL,
            message=message,
            evidence={"rank": d.rank, "agreeing_ranks": agree, "ranks": n_ranks, "metric": d.metric,
                      "onset_step": d.step, "nonfinite": d.nonfinite, "gap_log": None if np.isnan(d.gap) else d.gap,
                      "own_move_log": _num(d.own_move), "others_move_log": _num(d.others_move),
                      "relative_to_others": _num(float(np.exp(d.own_move - d.others_move))),
                      "text": f"rank {d.rank} {d.metric} vs ranks {others}: {fmt(float(np.exp(d.own_move)))}x "
                              f"its own level against {fmt(float(np.exp(d.others_move)))}x theirs"},
        )

    def _segment(self, run: RunData, step: int) -> int:
        t = run.ranks.filter(pl.col("step") >= step)
        return int(t.get_column("segment").min()) if t.height else 0  # type: ignore[arg-type]


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _effective(t: pl.DataFrame) -> pl.DataFrame:
    """One value per (rank, metric, step): a later segment's row wins (a restart re-logs steps)."""
    return t.sort("segment", maintain_order=True).unique(subset=["rank", "metric", "step"], keep="last")


def _wide(t: pl.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """(steps, values of shape (steps, ranks), ranks) at the steps every rank logged ``metric``; None for < 2 ranks."""
    sub = t.filter(pl.col("metric") == metric)
    ranks = sorted(sub.get_column("rank").unique().to_list())
    if len(ranks) < 2:
        return None
    wide = sub.pivot(on="rank", index="step", values="value").drop_nulls().sort("step")
    cols = [str(r) for r in ranks]
    return wide.get_column("step").to_numpy(), wide.select(cols).to_numpy().astype(np.float64), ranks


def _move(v: np.ndarray, i: int, window: int) -> float:
    """Log move of ``v``: median of ``window`` points from ``i`` on minus the median of ``window`` points before."""
    before, after = v[max(0, i - window):i], v[i:i + window]
    before, after = before[np.isfinite(before)], after[np.isfinite(after)]
    if before.size == 0 or after.size == 0:
        return float("nan")
    return float(np.median(after) - np.median(before))


def _mostly_finite(x: np.ndarray) -> bool:
    """At least half the values of the others after a non-finite step are finite (or none are logged yet)."""
    return x.size == 0 or float(np.isfinite(x).mean()) >= 0.5


def _run_lengths(flags: np.ndarray) -> np.ndarray:
    """Length of the run of True ending at each index (0 where False)."""
    idx = np.arange(flags.size)
    last_false = np.maximum.accumulate(np.where(~flags, idx, -1))
    return np.where(flags, idx - last_false, 0)
