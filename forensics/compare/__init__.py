"""Proxy vs target: what changed in the configuration, where the dynamics parted, which change explains it.

``compare(proxy_path, target_path)`` returns the JSON object of DESIGN.md section 7 (``compare``):
``schema_version``, ``proxy``, ``target``, ``differences`` (:func:`forensics.config_diff.diff`, plus the
settings read from the logs when a configuration lacks them: peak lr, warm-up, tokens per step),
``departure`` (the earliest series where the target leaves the proxy's band, with the gap and the step),
``explanations`` (ranked by the evidence that tells the settings apart) and ``trial`` (the short run that
tests the top one). Extra keys: ``departures`` (per series), ``alignment`` (``"step"`` or ``"tokens"``),
``lr_evidence`` (peak lr vs warm-up), ``mup_check``, ``target_analysis``, ``configs``.

Modules: :mod:`~forensics.compare.departure` (the departure test: every series both runs log, at matched
steps or tokens, against the proxy's own noise band; its docstring gives the rule and the thresholds),
:mod:`~forensics.compare.lr` (peak lr vs warm-up, settings read from the logs),
:mod:`~forensics.compare.explain` (ranked explanations, the trial); the muP check is
:func:`forensics.config_diff.mup_check`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from forensics import SCHEMA_VERSION
from forensics.compare.departure import (
    CONTROLS,
    FLOOR,
    FLOOR_GROWTH,
    GROWTH,
    K_SIGMA,
    LOSSES,
    SAME_REL,
    SIGNALS,
    SMOOTH,
    SUSTAIN,
    WINDOW,
    departure_of,
    departures,
    first_departure,
    tokens_per_step,
)
from forensics.compare.explain import ANALYSIS_LINKS, MECHANISMS, SIGNAL_SETTINGS, explain, trial_for
from forensics.compare.lr import LR_SHARE, log_differences, lr_evidence, lr_schedule_of, same_setting
from forensics.config_diff import diff, extract_config
from forensics.model import RunData, Verdict

__all__ = [
    "ANALYSIS_LINKS", "CONTROLS", "FLOOR", "FLOOR_GROWTH", "GROWTH", "K_SIGMA", "LOSSES", "LR_SHARE", "MECHANISMS",
    "SIGNALS", "SIGNAL_SETTINGS", "SMOOTH", "SUSTAIN", "WINDOW", "compare", "departure_of", "departures", "explain",
    "first_departure", "log_differences", "lr_evidence", "lr_schedule_of", "tokens_per_step", "trial_for",
]


def compare(proxy_path: str | Path, target_path: str | Path,
            loaded: tuple[RunData, RunData] | None = None) -> dict[str, Any]:
    """Compare a proxy run with its target run (DESIGN.md section 7, ``compare``).

    Args:
        proxy_path: The run folder of the proxy (the run that trained well).
        target_path: The run folder of the target (the run that did not).
        loaded: The two runs already read from those folders (the HTML report reads them to draw the series,
            so the CLI reads each once), or None to read them here.

    Returns:
        The JSON-ready dict: ``schema_version``, ``proxy``, ``target``, ``differences`` (each with ``source``:
        ``"config"`` or ``"logs"``), ``departure`` (``step``, ``signal``, ``gap`` in nats, ``ratio``, ``proxy``,
        ``target``, ``threshold``, ``tokens`` when aligned by tokens), ``explanations`` (with ``decided_by``),
        ``trial``; plus ``departures`` (every shared series), ``alignment``, ``lr_evidence``, ``mup_check``,
        ``target_analysis``, ``configs``.

    Raises:
        forensics.errors.InputError: either folder is missing or holds no logs.
    """
    from forensics.api import analyze_run, load
    from forensics.config_diff import flat_config, mup_check, same

    proxy, target = loaded if loaded is not None else (load(proxy_path), load(target_path))
    pc, tc = extract_config(proxy), extract_config(target)
    differences = [dict(d, source="config") for d in diff(pc, tc)]
    recorded = {d["setting"] for d in differences}
    differences += log_differences(proxy, target, pc, tc, recorded)
    deps, alignment = departures(proxy, target, pc, tc)
    first = first_departure(deps)
    lr_ev = lr_evidence(lr_schedule_of(proxy, pc), lr_schedule_of(target, tc), first)
    same_keys = {k for k in pc if k != "_found" and k in tc and same(pc[k], tc[k])}
    ps_log, ts_log = lr_schedule_of(proxy, {}), lr_schedule_of(target, {})
    if ps_log is not None and ts_log is not None:  # equal in the logged lr: ruled out, even without a config
        for k in ("peak_lr", "warmup_steps"):
            if same_setting(k, ps_log, ts_log):  # within the logging interval: no difference
                same_keys.add(k)
    rp, rt = tokens_per_step(proxy, {}), tokens_per_step(target, {})
    if rp and rt and math.isclose(rp, rt, rel_tol=SAME_REL):
        same_keys.add("global_batch_size")
    analysis = analyze_run(target)
    explanations = explain(differences, deps, first, analysis if analysis.verdict != Verdict.HEALTHY else None,
                           lr_ev, same_keys)
    top = explanations[0] if explanations else None
    return {
        "schema_version": SCHEMA_VERSION, "proxy": str(proxy_path), "target": str(target_path),
        "differences": differences, "departure": first, "explanations": explanations,
        "trial": trial_for(top, differences, first, tc),
        "departures": {k: ({kk: vv for kk, vv in v.items() if kk != "index"} if v else None) for k, v in deps.items()},
        "alignment": alignment, "lr_evidence": lr_ev,
        "mup_check": mup_check(flat_config(proxy), flat_config(target), pc, tc, proxy, target),
        "target_analysis": {"verdict": analysis.verdict, "cause": analysis.cause, "mechanism": analysis.mechanism,
                            "onset": dict(analysis.onset) if analysis.onset else None, "summary": analysis.summary},
        "configs": {"proxy": {k: v for k, v in pc.items() if k != "_found"},
                    "target": {k: v for k, v in tc.items() if k != "_found"}},
    }
