"""The shape of a recovered loss spike: confined to its batch, or a disturbance of the model.

A bad batch raises the loss on itself: the batches after it, on the same weights give or take one update,
score normally, so the loss is back in its band within a few steps. A disturbance of the optimizer or the
model (BLOOM 13B chronicles, the br14 case: a jump that needs about 500 iterations to get back) recovers
over tens to hundreds of steps. So without a grad norm to rule out a precursor, a spike that is back within
``CONFINED_STEPS`` steps of its onset still names its batch; a slower recovery leaves the cause open.
"""

from __future__ import annotations

from forensics.model import Finding

CONFINED_STEPS = 8
"""A spike back inside its band (2 sigma, for 10 points: signals.departures) within this many steps of its
onset is confined to its batch (up to 3 bad batches and a log interval of 2; our choice)."""


def confined_to_batch(f: Finding) -> bool:
    """True when the finding's finite spike is back in its band within ``CONFINED_STEPS`` steps of its onset.

    Args:
        f: A finding with ``recovered_step`` and ``onset_step`` (or ``step``) in its evidence (DB01).
    """
    ev = f.evidence
    rec, on = ev.get("recovered_step"), ev.get("onset_step", f.step)
    if rec is None or on is None or ev.get("nonfinite"):
        return False
    return int(rec) - int(on) <= CONFINED_STEPS
