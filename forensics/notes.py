"""The notes grammar: which remedies a run folder's notes say were tried and failed, and which are proposed.

Used by NT01 (``forensics/detectors/notes_attempts.py``), the run facts (``forensics/facts.py``: remedies that
failed) and the engine (a failed remedy argues against the cause it addresses). Source: docs/detectors.md#nt01.
"""

from __future__ import annotations

import re

from forensics.model import RunData

REMEDIES: dict[str, re.Pattern[str]] = {
    "skip_data": re.compile(r"skip[-_ ]train[-_ ]iteration|\bskip(ped|ping)?\b.{0,20}\b(data|batch|batches|"
                            r"iteration|iterations|range)\b|\bskips?\b\s+\d", re.I),
    "lower_lr": re.compile(r"\b(lower(ed)?|reduc\w*|decreas\w*|halv\w*)\b.{0,15}\b(lr|learning rate)\b|"
                           r"\blr\s*[=:]?\s*\d(\.\d+)?e-\d|\blr\s*(x|\*)\s*0?\.\d|\blr multiplied by 0?\.\d", re.I),
    "reshuffle_data": re.compile(r"reshuffl\w*|new seed|different seed|another seed|data order", re.I),
    "optimizer_reset": re.compile(r"no-load-optim|optimi[sz]er (state )?reset|reset the optimi[sz]er", re.I),
    "beta2": re.compile(r"beta2|adam-beta2|betas", re.I),
    "init_std": re.compile(r"init-method-std|init_method_std|init(ialisation|ialization)? std|weight init", re.I),
    "precision": re.compile(r"\bbf16\b|\bfp32\b|float32|softmax in fp32", re.I),
    "qk_norm": re.compile(r"qk[-_ ]?(layer)?norm", re.I),
    "z_loss": re.compile(r"z[-_ ]?loss", re.I),
}
"""Remedy -> the pattern naming it in a notes line."""

FAILED = re.compile(r"\bfail(ed|s)?\b|diverg\w*|did not help|didn't help|no help|same (behaviou?r|way|shape)|"
                    r"wrong way|roller coaster|same as \d|like \d|no effect|never took effect|abandoned|"
                    r"no progress|glitch", re.I)
IDEAS = re.compile(r"open ideas?|ideas?:|\bnext\b:|\btodo\b|to try|goes first", re.I)

ADDRESSES = {
    "skip_data": "data_batch",
    "reshuffle_data": "data_batch",
    "lower_lr": "update_scale_growth",
    "optimizer_reset": "state_not_restored",
}
"""A failed remedy argues against the cause it addresses."""

QUOTE_CHARS = 300
"""Characters of a notes line kept as the quote of a failed remedy or an idea (display; our choice)."""


_NOT_NOTES_NAME = re.compile(r"^(?:readme|changelog|changes|history|contributing|license|licence|code_of_conduct|"
                             r"security|authors|citation|model_card|modelcard)\b", re.I)
_NOT_NOTES_DIR = re.compile(r"^(?:code\w*|src|source|docs?|repo\w*|\w*snapshot\w*|site-packages|node_modules|vendor|"
                            r"third_party|scripts?|\.git|\.github)$", re.I)


def is_notes(path: str) -> bool:
    """True when a Markdown file of the run folder can be the team's notes, not documentation copied in.

    A code snapshot's README, a changelog or a model card (a name in ``_NOT_NOTES_NAME``, or any file under a
    code or docs folder, ``_NOT_NOTES_DIR``) holds the words of remedies (``lower lr``, ``beta2``) that nobody
    tried on this run, so it is not read as notes (the family: documentation kept beside a run for
    reproducibility).
    """
    parts = path.replace("\\", "/").split("/")
    return not _NOT_NOTES_NAME.match(parts[-1]) and not any(_NOT_NOTES_DIR.match(p) for p in parts[:-1])


def read_notes(run: RunData) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(failed remedies, proposed remedies): remedy -> the notes lines that say so."""
    failed: dict[str, list[str]] = {}
    ideas: dict[str, list[str]] = {}
    notes = run.meta.get("notes") or {}
    for path, text in notes.items():
        if not is_notes(str(path)):
            continue
        in_ideas = False
        for unit in _units(str(text)):
            if IDEAS.search(unit):
                in_ideas = True
            for name, pat in REMEDIES.items():
                if not pat.search(unit):
                    continue
                if in_ideas:
                    ideas.setdefault(name, []).append(unit[:QUOTE_CHARS])
                elif FAILED.search(unit) and not (name == "lower_lr" and "back to" in unit.lower()):
                    failed.setdefault(name, []).append(unit[:QUOTE_CHARS])
            if not unit.startswith("|"):
                in_ideas = in_ideas and bool(IDEAS.search(unit))
    return failed, ideas


def _units(text: str) -> list[str]:
    """Table rows one by one; other prose as paragraphs (a remedy and its outcome often span lines)."""
    out: list[str] = []
    para: list[str] = []
    in_code = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("|") or not line:
            if para:
                out.append(" ".join(para))
                para = []
            if line:
                out.append(line)
            continue
        para.append(line)
    if para:
        out.append(" ".join(para))
    return out
