"""Explanations of a departure, ranked by the evidence that tells the settings apart, and the trial of the top one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forensics.calibration import CONFIDENCE_MAX, CONFIDENCE_MIN
from forensics.compare.departure import K_SIGMA, LOSSES
from forensics.model import Mechanism

SIGNAL_SETTINGS: dict[str, tuple[str, ...]] = {
    "attn_logit_max": ("qk_layernorm", "peak_lr", "warmup_steps", "d_model"),
    "output_logit_max": ("z_loss", "peak_lr"),
    "log_z": ("z_loss", "peak_lr"),
    "update_ratio": ("peak_lr", "warmup_steps", "global_batch_size"),
    "grad_norm": ("peak_lr", "warmup_steps", "clip_grad_norm"),
}
"""A departing series -> settings whose change acts through it (used when no configuration records one)."""

MECHANISMS: dict[str, tuple[str, tuple[str, ...], float]] = {
    "qk_layernorm": ("attention_logit_growth", ("attn_logit_max",), 0.5),
    "z_loss": ("output_logit_divergence", ("log_z", "output_logit_max"), 0.5),
    "peak_lr": ("lr_too_high", ("update_ratio", "grad_norm", "attn_logit_max", "output_logit_max", "log_z"), 0.45),
    "warmup_steps": ("warmup_too_short", ("update_ratio", "grad_norm", "attn_logit_max", "output_logit_max"), 0.4),
    "warmup_tokens": ("warmup_too_short", ("update_ratio", "grad_norm", "attn_logit_max", "output_logit_max"), 0.4),
    "global_batch_size": ("batch_lr_mismatch", ("loss", "update_ratio", "grad_norm", "eval_loss"), 0.4),
    "grad_accum": ("grad_scaling", ("grad_norm",), 0.3),
    "eps": ("adam_epsilon", ("update_ratio",), 0.35),
    "beta1": ("optimizer_state", ("update_ratio", "grad_norm"), 0.25),
    "beta2": ("optimizer_state", ("update_ratio", "grad_norm"), 0.3),
    "optimizer": ("optimizer_state", ("update_ratio", "grad_norm"), 0.3),
    "precision": ("fp16_overflow", ("loss", "grad_norm", "attn_logit_max"), 0.4),
    "d_model": ("width_without_mup", ("attn_logit_max", "update_ratio", "grad_norm", "output_logit_max"), 0.4),
    "n_layers": ("depth", ("grad_norm", "update_ratio"), 0.3),
    "n_heads": ("head_dim", ("attn_logit_max",), 0.25),
    "mup": ("parametrisation", ("update_ratio", "attn_logit_max"), 0.35),
    "weight_decay": ("param_norm_growth", ("attn_logit_max", "log_z", "update_ratio"), 0.25),
    "init_std": ("init_scale", ("grad_norm", "attn_logit_max"), 0.3),
    "clip_grad_norm": ("no_clipping", ("grad_norm", "update_ratio"), 0.3),
    "seq_len": ("context_length", ("attn_logit_max",), 0.25),
    "norm": ("normalisation", ("grad_norm", "update_ratio"), 0.3),
    "norm_eps": ("normalisation", ("grad_norm",), 0.15),
    "lr_schedule": ("schedule", ("update_ratio",), 0.2),
    "total_steps": ("schedule", ("update_ratio",), 0.1),
}
"""Setting -> (mechanism through which a change acts, the signals that should depart first, prior)."""

ANALYSIS_LINKS: dict[str, tuple[str, ...]] = {
    Mechanism.ATTENTION_LOGIT_GROWTH: ("qk_layernorm", "peak_lr", "d_model", "n_heads", "seq_len", "weight_decay"),
    Mechanism.OUTPUT_LOGIT_DIVERGENCE: ("z_loss", "weight_decay", "peak_lr"),
    Mechanism.LR_TOO_HIGH: ("peak_lr", "warmup_steps", "warmup_tokens", "global_batch_size", "d_model", "mup",
                            "clip_grad_norm", "beta2"),
    Mechanism.ADAM_EPSILON: ("eps",),
    Mechanism.ACTIVATION_OVERFLOW: ("precision", "qk_layernorm"),
    Mechanism.LOSS_SCALE_COLLAPSE: ("precision",),
    Mechanism.INIT_SCALE: ("init_std",),
    Mechanism.GA_NORMALISATION: ("grad_accum",),
}
"""The target's own analyze() mechanism -> the settings whose change it supports."""


@dataclass(frozen=True)
class Terms:
    """The terms added to a setting's prior (:data:`MECHANISMS`) by the evidence, see :func:`explain`.

    All ours, set on the proxy/target pairs of ``sample_logs/make_compare_runs.py`` and the compare tests: the
    order of the evidence matters more than the values (which series departs first decides most, then what
    the lr schedules say, then the target's own analysis).
    """

    first_primary: float = 0.35
    first_predicted: float = 0.2
    first_other: float = 0.15
    also_departs: float = 0.1
    lr_decides: float = 0.35
    lr_other: float = 0.25
    derived: float = 0.3
    analysis_links: float = 0.15
    from_logs: float = 0.05
    analysis_only_share: float = 0.5
    inferred_prior_share: float = 0.6
    inferred_rank_step: float = 0.05


TERMS = Terms()
"""The terms in use."""
TRIAL_MARGIN_STEPS = 50
"""The trial runs at least this many steps past the departure (or half the departure step, if more; our choice)."""
TRIAL_DEFAULT_STEPS = 1000
"""Trial length without a departure: the target's total steps, at most this many (our choice)."""


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def explain(differences: list[dict[str, Any]], deps: dict[str, dict[str, Any] | None],
            first: dict[str, Any] | None, analysis: Any | None,
            lr_ev: dict[str, Any] | None = None, recorded_same: set[str] | None = None) -> list[dict[str, Any]]:
    """Rank the differences that matter as explanations of the departure, by evidence that tells them apart.

    Score = prior of the setting's mechanism (:data:`MECHANISMS`), +0.35 when the first departing series
    is the mechanism's primary signal (+0.2 when it is one of its signals, -0.15 when it is none of them),
    +0.1 when another predicted signal departs too, +0.15 when the target's own analyze() mechanism supports
    the setting (:data:`ANALYSIS_LINKS`); for peak lr vs warm-up, +0.35 to the one :func:`lr_evidence`
    decides for and -0.25 to the other; -0.3 for a difference derived from another one (warm-up tokens that
    changed only because the batch or the sequence length did); clipped to [0.02, 0.98]. A setting that no
    configuration records but the first departing series points at (:data:`SIGNAL_SETTINGS`) is added at a
    low prior; the target's analyze() finding is added (setting ``None``) when no difference covers it.

    Args:
        differences: :func:`forensics.config_diff.diff` plus :func:`log_differences`.
        deps: :func:`departures`.
        first: :func:`first_departure`.
        analysis: The target's own :class:`forensics.model.Analysis` (``None`` when healthy).
        lr_ev: :func:`lr_evidence`.
        recorded_same: Settings both runs record with equal values (ruled out as explanations).

    Returns:
        ``[{"setting", "mechanism", "confidence", "for", "against", "decided_by"}]``, highest first.
    """
    mech_an = getattr(analysis, "mechanism", None) if analysis is not None else None
    out: list[dict[str, Any]] = []
    covered = False
    for d in differences:
        if not d["matters"] or d["setting"] not in MECHANISMS:
            continue
        entry, links = _explain_difference(d, differences, deps, first, analysis, mech_an, lr_ev)
        covered = covered or links
        out.append(entry)
    if first is not None:
        names = {d["setting"] for d in differences}
        inferred, links = _inferred(first, names | (recorded_same or set()), analysis, mech_an)
        covered = covered or links
        out.extend(inferred)
    if analysis is not None and analysis.cause and not covered:
        out.append({"setting": None, "mechanism": mech_an or analysis.cause,
                    "confidence": round(TERMS.analysis_only_share * float(analysis.confidence), 3),
                    "for": [f"the target's own analysis: {analysis.summary}"],
                    "against": ["no recorded configuration difference acts through this mechanism"], "decided_by": []})
    out.sort(key=lambda e: -e["confidence"])
    return out


def _departure_terms(score: float, first: dict[str, Any] | None, deps: dict[str, dict[str, Any] | None], mech: str,
                     sigs: tuple[str, ...]) -> tuple[float, list[str], list[str], list[str]]:
    """(score, for, against, decided by) after the terms of which series departs first and which depart too."""
    if first is None:
        return score, [], ["no series of the target leaves the proxy's band"], []
    pro: list[str] = []
    con: list[str] = []
    decided: list[str] = []
    dep = deps.get(first["signal"]) or {}
    base = first["signal"].split("/")[0]
    where = (f"{first['signal']} departs first, at step {first['step']} (target {_fmt(dep.get('target'))} "
             f"vs proxy {_fmt(dep.get('proxy'))}, gap {_fmt(dep.get('delta'))} vs band "
             f"{_fmt(dep.get('threshold'))})")
    if base == sigs[0]:
        score += TERMS.first_primary
        pro.append(f"{where}: the signal {mech} predicts")
        decided.append(f"first departing series {first['signal']}")
    elif base in sigs:
        score += TERMS.first_predicted
        pro.append(f"{where}: one of the signals {mech} predicts")
    else:
        score -= TERMS.first_other
        con.append(f"{where}; {mech} predicts {', '.join(sigs)} first")
    also = [s for s in sigs if s != base and deps.get(s)]
    if also:
        score += TERMS.also_departs
        pro.append("also departs: " + ", ".join(f"{s} at step {deps[s]['step']}" for s in also))  # type: ignore[index]
    return score, pro, con, decided


def _lr_terms(score: float, key: str, lr_ev: dict[str, Any] | None) -> tuple[float, list[str], list[str], list[str]]:
    """(score, for, against, decided by) after the peak lr or warm-up terms of :func:`lr_evidence`."""
    if lr_ev is None or key not in ("peak_lr", "warmup_steps"):
        return score, [], [], []
    if lr_ev["decides"] == key:
        return score + TERMS.lr_decides, [lr_ev["why"]], [], [
            "the lr ratio at the departure: " + ("schedule shape" if key == "warmup_steps" else "peak ratio")]
    if lr_ev["decides"] in ("peak_lr", "warmup_steps"):
        return score - TERMS.lr_other, [], [lr_ev["why"]], []
    if lr_ev["decides"] == "ambiguous":
        return score, [], [f"{lr_ev['why']}; what would separate them: {lr_ev['separate']}"], []
    return score, [], [], []


def _explain_difference(d: dict[str, Any], differences: list[dict[str, Any]], deps: dict[str, dict[str, Any] | None],
                        first: dict[str, Any] | None, analysis: Any | None, mech_an: str | None,
                        lr_ev: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """One recorded difference as an explanation, and whether the target's own analysis supports it."""
    mech, sigs, score = MECHANISMS[d["setting"]]
    score, pro, con, decided = _departure_terms(score, first, deps, mech, sigs)
    pro.insert(0, d["why"])
    key = "warmup_steps" if d["setting"] in ("warmup_steps", "warmup_tokens") else d["setting"]
    score, lr_pro, lr_con, lr_decided = _lr_terms(score, key, lr_ev)
    pro, con, decided = pro + lr_pro, con + lr_con, decided + lr_decided
    derived = _derived_from(d, differences)
    if derived:
        score -= TERMS.derived
        con.append(f"follows from the {derived} difference" + (
            "" if derived == "warmup_steps" else " (warm-up steps unchanged)"))
        d.setdefault("derived_from", derived)
    links = bool(mech_an and d["setting"] in ANALYSIS_LINKS.get(mech_an, ()))
    if links:
        score += TERMS.analysis_links
        pro.append(f"the target's own analysis, {analysis.summary}")
    if d.get("source") == "logs":
        score -= TERMS.from_logs
        con.append("not in either configuration: read from the logged series")
    conf = round(min(CONFIDENCE_MAX, max(CONFIDENCE_MIN, score)), 3)
    return {"setting": d["setting"], "mechanism": mech, "confidence": conf,
            "for": pro, "against": con, "decided_by": decided}, links


def _inferred(first: dict[str, Any], known: set[str], analysis: Any | None,
              mech_an: str | None) -> tuple[list[dict[str, Any]], bool]:
    """Settings no configuration records that the first departing series points at (:data:`SIGNAL_SETTINGS`)."""
    out: list[dict[str, Any]] = []
    covered = False
    for i, setting in enumerate(SIGNAL_SETTINGS.get(first["signal"].split("/")[0], ())):
        if setting in known:
            continue
        mech, _sigs, prior = MECHANISMS[setting]
        score = max(CONFIDENCE_MIN, TERMS.inferred_prior_share * prior - TERMS.inferred_rank_step * i)
        pro = [f"{first['signal']} departs first, at step {first['step']}: {mech} acts through it"]
        if mech_an and setting in ANALYSIS_LINKS.get(mech_an, ()):
            score += TERMS.analysis_links
            covered = True
            pro.append(f"the target's own analysis, {analysis.summary}")
        out.append({"setting": setting, "mechanism": mech, "confidence": round(min(CONFIDENCE_MAX, score), 3),
                    "for": pro,
                    "against": [f"neither configuration records {setting}: inferred from the departing series "
                                "only; check the two runs' code or launch flags"],
                    "decided_by": [f"first departing series {first['signal']}"], "inferred": True})
    return out, covered


def _derived_from(d: dict[str, Any], differences: list[dict[str, Any]]) -> str | None:
    """The difference that ``d`` follows from (warm-up tokens from the batch or the sequence length)."""
    if d["setting"] != "warmup_tokens":
        return None
    names = {x["setting"] for x in differences}
    roots = [r for r in ("global_batch_size", "seq_len") if r in names]
    if "warmup_steps" in names:
        return None if roots else "warmup_steps"
    for root in roots:
        if root in names:
            return root
    return None


def trial_for(top: dict[str, Any] | None, differences: list[dict[str, Any]], first: dict[str, Any] | None,
              target_cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The short run that tests the top explanation: the target with the proxy's value of that one knob.

    Steps: through the departure step plus a margin of max(50, 50% of it), capped at the target's total steps.
    """
    if top is None or top["setting"] is None:
        return None
    d = next((x for x in differences if x["setting"] == top["setting"]), None)
    if d is None:  # inferred from the departing series: no recorded value to restore
        d = {"setting": top["setting"], "proxy": "the proxy's setting (not recorded)", "target": "an unrecorded value"}
    total = target_cfg.get("total_steps")
    dep = first["step"] if first else None
    steps = dep + max(TRIAL_MARGIN_STEPS, dep // 2) if dep is not None else min(total or TRIAL_DEFAULT_STEPS,
                                                                                 TRIAL_DEFAULT_STEPS)
    if total:
        steps = min(steps, int(total))
    sig = first["signal"] if first else "loss"
    return {
        "name": f"restore {d['setting']}",
        "change": f"run the target with {d['setting']} = {d['proxy']} (the proxy's value; the target has "
                  f"{d['target']}), everything else unchanged, same seed and data order",
        "setting": d["setting"], "value": d["proxy"], "steps": int(steps),
        "control": "the unchanged target for the same steps (or its logged run), to rule out noise",
        "success_criteria": [
            f"{sig} stays inside the proxy's band (max({K_SIGMA:g} robust sigma, "
            f"{'20%' if sig.split('/')[0] in LOSSES else 'x5'})) through step {steps}"
            + (f", where the target left it at step {dep}" if dep is not None else ""),
            "loss at matched steps within the proxy's step-to-step spread",
        ],
    }


