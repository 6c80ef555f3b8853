"""The deciding half: detectors report, the engine decides (STYLE.md items 5 and 15).

- :mod:`forensics.engine.decide`: :func:`decide` (the entry point), the attempts a restart rolled back, verdict.
- :mod:`forensics.engine.rules`: per-family scoring, notes, slow and early divergence.
- :mod:`forensics.engine.chain`: demotions of families off the causal chain.
- :mod:`forensics.engine.choose`: lead-lag and the symptom/cause corrections.
- :mod:`forensics.engine.onset`: onset and causal chain (ENG01).
- :mod:`forensics.engine.weights`: every number, with its source; :mod:`~forensics.engine.codes` and
  :mod:`~forensics.engine.keys`: the finding codes and evidence keys the engine reads.
"""

from forensics.engine.decide import Decision, decide, decide_attempts, decide_timeline, main_evidence, run_detectors
from forensics.engine.weights import WEIGHTS, Weights

__all__ = ["WEIGHTS", "Decision", "Weights", "decide", "decide_attempts", "decide_timeline", "main_evidence",
           "run_detectors"]
