"""The engine's weights and windows, in one frozen dataclass, each with its source.

None of these is fitted: they are this project's choices, checked on the labelled corpus and the tuning part
of the varied corpus (``sample_logs/make_varied_corpus.py``). The confidence the reports show is the fitted
map of :mod:`forensics.calibration` applied to the raw score these weights give.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

OUR_CHOICE = "our choice, checked on the labelled corpus and the varied corpus' tuning part"


def _w(value: float, source: str = OUR_CHOICE) -> float:
    return field(default=value, metadata={"source": source})  # type: ignore[return-value]


@dataclass(frozen=True)
class Weights:
    """Every number the engine's rules use (see each field's ``metadata["source"]``).

    Attributes:
        min_cause_conf: A finding argues for its cause only at or above this confidence.
        path_window: Departures this many steps before a cause's first finding still count as its onset;
            half of it is the largest gap between two fp16 skips chained into an overflow's onset.
        unlogged_grad_norm: Factor on a recovered "bad batch" when no grad-norm series rules out a precursor.
        has_precursor: Factor on a "bad batch" that growth precedes (the spike has a precursor).
        weak_margin: A family with no strong finding stays this far below ``min_cause_conf``.
        failed_remedy: Factor on a cause whose remedy the notes say was tried and failed.
        early_steps: A run that fails within this many steps of its first logged step diverged at the start.
        early_divergence: Score of an early divergence (update growth, lr too high).
        slow_divergence: Score of a slow divergence no family explains (update growth).
        demote_margin: A demoted family ends this far below ``min_cause_conf``.
        collapse_growth: Score of update growth that precedes a loss-scale collapse.
        collapse_cap: Cap on the overflow hypothesis once growth explains the collapse.
        consequence_cap: Cap on growth that starts after an lr reset (its consequence).
        failed_lr_cap: Cap on "lr too high" when the notes say lower lrs failed.
        failed_lr_unknown: Score of the open ``unknown`` answer that replaces it.
        unexplained_failure: Score of ``unknown`` for a failure no detector names a cause for.
        unexplained_spike: Score of a transient spike no detector names a cause for.
        no_learning: Score of a run that never learned after an early rise of its loss (lr too high).
        nonfinite_start: Score of ``unknown`` for a loss non-finite from the first logged step.
        growth_lead: Last logged points before an overflow's first finding judged for a growth precursor.
        recurring_spikes: Recovered loss spikes (median gap <= path_window) from which a run is an anomaly.
        attempt_min_conf: A rolled-back attempt that did not fail outranks the run only at this raw score.
        max_attempts: Rolled-back attempts analysed on their own (the earliest ones).
        recurring_failure: Factor on "bad batch" when failures recur at different steps after restarts.
        support_listed: Supporting sentences kept per hypothesis; ``chain_links``: links kept in a chain.
    """

    min_cause_conf: float = _w(0.5, "our choice: the middle of the confidence scale")
    path_window: int = _w(128, "our choice: the trailing window of the departure z-scores (forensics/signals.py)")
    unlogged_grad_norm: float = _w(0.6)
    has_precursor: float = _w(0.4)
    weak_margin: float = _w(0.01)
    failed_remedy: float = _w(0.5, "our choice (DESIGN.md section 4: earlier attempts recorded in the folder)")
    early_steps: int = _w(30)
    early_divergence: float = _w(0.55)
    slow_divergence: float = _w(0.55, "our choice (BigScience 104B 'non-spike diverging', docs/detectors.md#dv01)")
    demote_margin: float = _w(0.05)
    collapse_growth: float = _w(0.7)
    collapse_cap: float = _w(0.45)
    consequence_cap: float = _w(0.4)
    failed_lr_cap: float = _w(0.45)
    failed_lr_unknown: float = _w(0.5)
    unexplained_failure: float = _w(0.3)
    unexplained_spike: float = _w(0.4)
    no_learning: float = _w(0.55, "our choice, as early_divergence (docs/detectors.md#st01: a collapse to the "
                                  "uniform prediction at a far too high lr)")
    nonfinite_start: float = _w(0.5, "our choice: names the open question at min_cause_conf")
    growth_lead: int = _w(5, "DB01's lead_steps: grad norm leads the loss by 1-4 steps (BLOOM tr11 chronicles)")
    recurring_spikes: int = _w(3)
    attempt_min_conf: float = _w(0.65)
    max_attempts: int = _w(6)
    recurring_failure: float = _w(0.4)
    support_listed: int = _w(6, "display limit")
    chain_links: int = _w(8, "display limit")

    @property
    def demoted(self) -> float:
        """The score a demoted family is lowered to (at most)."""
        return self.min_cause_conf - self.demote_margin


WEIGHTS = Weights()
"""The weights in use."""


def sources(w: Weights = WEIGHTS) -> dict[str, tuple[float, str]]:
    """``{field: (value, source)}`` for every weight (what ``forensics detectors`` or a report can print)."""
    return {f.name: (getattr(w, f.name), str(f.metadata.get("source", ""))) for f in fields(w)}
