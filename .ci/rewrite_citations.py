#!/usr/bin/env python3
# rewrite-citations: skip  (this file's examples are old-style citations on purpose)
"""Rewrite citations of the old reference notes into ``docs/<file>.md#<anchor>`` form (idempotent).

Code written against the research notes outside the repository cites them as ``detectors.md D13``,
``formats.md section 4.1``, ``reference/formats.md 6.2, "Partial writes"``,
``/work/shared/reference/detectors.md section 3.3 and D2``, ``detectors.md §SP01``, ``formats.md:
Megatron`` or a bare ``tiny-runs.md``. This script finds every such citation in the ``*.py`` and ``*.md``
files under :data:`ROOTS` (and the top-level ``README.md``) and replaces it with the path of our own
notes in ``docs/`` and the anchor of the matching section, e.g. ``docs/detectors.md#dv01``.

How a section is mapped, in this order:

1. the old notes' section numbers and detector numbers (:data:`NUMBERED`; ``D13`` -> ``dv01``,
   formats ``6.2`` -> ``torch-zip``; an unknown ``6.2.1`` falls back to ``6.2``, then ``6``);
2. an anchor of that name in ``docs/<file>.md`` (``SP01`` -> ``sp01``);
3. a section name or a quoted phrase: the :data:`ALIASES` patterns, then the heading texts of
   ``docs/<file>.md`` (``loss.spike`` -> ``sp01``, ``Megatron`` -> ``megatron``);
4. for a bare ``tiny-runs.md`` only (not one already under ``docs/``), the words of the sentence around
   it (the notes are one section per fault, and the sentence names the fault).

A citation whose section cannot be mapped still gets its ``docs/`` path, keeps its old section words
and is reported as UNMAPPED (``tests/test_docs.py`` then fails on it, so nobody forgets it). Nothing is
ever an error: the script prints what it changed and what it could not map, and exits 0 (``--check``:
exits 1 when a file would change or something is unmapped, and writes nothing). A ``.py`` file that would
no longer compile after the rewrite is left alone and reported. Files containing the marker
``rewrite-citations: skip`` are not touched.

Usage::

    python .ci/rewrite_citations.py            # rewrite in place, from the repository root
    python .ci/rewrite_citations.py --check    # report only
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("forensics", "parsers", "reports", "benchmarks", "sample_logs", "tests")
"""Folders (relative to the repository root) whose ``*.py`` and ``*.md`` files are rewritten."""
SKIP_MARK = "rewrite-citations: skip"
NOTES = ("detectors", "formats", "tiny-runs")

NUMBERED: dict[str, dict[str, str]] = {
    "detectors": {
        # detector numbers of the old notes' table (b)
        "D0": "int01", "D1": "nf01", "D2": "ov01", "D3": "sp01", "D4": "gn01", "D5": "up01", "D6": "lr01",
        "D7": "db01", "D8": "at01", "D9": "ol01", "D10": "adam-epsilon", "D11": "wu01", "D12": "hw01",
        "D13": "dv01", "D14": "st01", "D15": "cross-run-audit",
        # lettered and numbered sections
        "(a)": "sources", "(b)": "conventions",
        "1": "src-smdebug", "2": "sources", "3": "src-megatron-checks", "3.1": "src-megatron-checks",
        "3.2": "src-megatron-rsm", "3.3": "loss-scalers", "3.4": "src-megatron-resume", "4": "sources",
        "4.1": "src-olmo-core", "4.2": "src-palm", "4.3": "src-opt", "4.4": "src-bigscience", "5": "sources",
        "6": "sources", "7": "src-resume-issues",
    },
    "formats": {
        "0": "hazards", "1": "tensorboard", "1.1": "tensorboard-files", "1.2": "tensorboard-framing",
        "1.3": "tensorboard-schema", "1.4": "tensorboard-scalars", "1.5": "tensorboard-readers",
        "1.6": "tensorboard-readers", "1.7": "tensorboard-damage", "2": "wandb", "2.1": "wandb-layout",
        "2.2": "wandb-framing", "2.3": "wandb-records", "2.4": "wandb-history", "2.5": "wandb-framing",
        "2.6": "wandb-history", "2.7": "wandb-framing", "3": "hf-trainer", "3.1": "hf-trainer-state",
        "3.2": "hf-stdout", "4": "stdout", "4.1": "megatron", "4.2": "deepspeed", "4.3": "nemo",
        "4.4": "torchtitan", "4.5": "nanogpt", "4.6": "olmo", "5": "metric-files", "5.1": "lightning-csv",
        "5.2": "mlflow", "5.3": "jsonl", "6": "checkpoints", "6.1": "safetensors", "6.2": "torch-zip",
        "6.3": "optimizer-state", "6.4": "dcp", "6.5": "deepspeed-zero", "6.6": "megatron-checkpoints",
        "6.7": "streaming-reduction", "7": "our-choices",
    },
    "tiny-runs": {},
}
"""Section and detector numbers of the old notes -> our anchors."""

ALIASES: dict[str, tuple[tuple[str, str], ...]] = {
    "detectors": (
        (r"recovery", "recovery-trial"),
        (r"back-?track", "onset-backtracking"),
        (r"convention|robust z|\bmad\b|trailing window", "conventions"),
        (r"sustained|drift", "sustained-rise"),
        (r"first anomalous|onset", "onset"),
        (r"loss[- ]?scal|scaler|calibration", "loss-scalers"),
        (r"fp16 infer|is_fp16|precision", "fp16-inference"),
        (r"epsilon|\beps\b", "adam-epsilon"),
        (r"audit|cohort|cross-run", "cross-run-audit"),
        (r"olmo", "src-olmo-core"), (r"palm", "src-palm"), (r"\bopt\b", "src-opt"),
        (r"bigscience|bloom", "src-bigscience"), (r"wortsman", "src-wortsman"), (r"takase|spike no more", "src-takase"),
        (r"molybog", "src-molybog"), (r"dehghani|vit-22b", "src-dehghani"), (r"marin", "src-marin"),
        (r"smdebug|sagemaker", "src-smdebug"), (r"rerun|rsm\b", "src-megatron-rsm"),
    ),
    "formats": (
        (r"partial write|truncat.*(zip|torch)|central directory", "torch-zip-partial"),
        (r"pickle|unpickl", "torch-zip-pickle"),
        (r"bf16|loss scale: 1\.0|constant.*scale|collapsed fp16 scale", "bf16-loss-scale"),
        (r"lm loss|megatron.*nan|nan.*megatron", "megatron-nan"),
        (r"fairseq.*scale|loss_scale=0|scales? as 0", "fairseq-loss-scale"),
        (r"reservoir|purge|downsampl|event ?accumulator", "tensorboard-readers"),
        (r"tfrecord|masked crc|crc32c", "tensorboard-framing"),
        (r"simple_value|scalar encoding", "tensorboard-scalars"),
        (r"tensorboard|tfevents", "tensorboard"),
        (r"leveldb|\.wandb|w&b.*(fram|block|log format)|transaction log", "wandb-framing"),
        (r"value_json|history", "wandb-history"),
        (r"wandb|w&b|weights ?& ?biases", "wandb"),
        (r"trainer_state|log_history|nan_inf_filter", "hf-trainer-state"),
        (r"hf stdout|trainer stdout|dict repr", "hf-stdout"),
        (r"hugging ?face|\bhf\b", "hf-trainer"),
        (r"megatron.*checkpoint|iter_\d|model_optim_rng", "megatron-checkpoints"),
        (r"megatron", "megatron"), (r"deepspeed.*zero|\bzero\b", "deepspeed-zero"), (r"deepspeed", "deepspeed"),
        (r"fairseq|metaseq", "fairseq"), (r"nemo", "nemo"), (r"torchtitan|titan", "torchtitan"),
        (r"nanogpt", "nanogpt"), (r"olmo", "olmo"),
        (r"lightning|csvlogger|metrics\.csv", "lightning-csv"), (r"mlflow|mlruns", "mlflow"),
        (r"jsonl", "jsonl"), (r"safetensors", "safetensors"),
        (r"exp_avg|optimizer state|adam|global_step|scheduler state", "optimizer-state"),
        (r"distcp|distributed checkpoint|\bdcp\b", "dcp"),
        (r"bfloat16|bf16 bit|stream|per-tensor norm|without loading", "streaming-reduction"),
        (r"torch\.save|\.pt\b|zip", "torch-zip"),
        (r"precision|lossy|rounded", "precision"),
        (r"hazard|truncated|damage|every reader", "hazards"),
    ),
    "tiny-runs": (
        (r"output[- ]logit|log ?z\b|z-loss", "output-logit-divergence"),
        (r"overflow|fp16", "overflow"),
        (r"exp_avg|non-?finite state|nonfinite_state", "nonfinite-state"),
        (r"update[- ]scale|update ratio|a window|window, not a step", "update-scale-growth"),
        (r"attention|q/k|qk", "attention-logit-growth"),
        (r"lr[- ]schedule|scheduler|resume", "lr-schedule-reset"),
        (r"bad batch|data[_ ]batch|padd", "data-batch"),
        (r"sweep|proxy", "lr-sweep"),
        (r"corpus|label", "corpus"),
        (r"wandb|w&b", "wandb"),
        (r"hugging ?face|\bhf\b|trainer", "hf-trainer"),
        (r"job|die|abort", "job-behaviour"),
        (r"cpu|thread|speed|determinis|seed", "setup"),
        (r"healthy", "healthy"),
    ),
}
"""Per notes file: (case-insensitive pattern on a section name or phrase, anchor), first match wins."""

_CITE = re.compile(
    r"(?<![\w.#/-])(?P<open>``|`)?(?P<prefix>(?:[\w.~-]*/)*)(?P<name>detectors|formats|tiny-runs)\.md"
    r"(?P<frag>#[\w-]+)?(?P<close>``|`)?"
)
_SEP = r"[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?"
_INTRO = re.compile(r"[ \t]*(?P<punct>[,:])?" + _SEP + r"(?P<kw>§[ \t]*|sections?[ \t]+|sec\.[ \t]*)?")
_TOKEN = re.compile(
    r"(?P<d>D\d{1,2})\b|\((?P<pd>D\d{1,2})\)"
    r"|(?P<code>[A-Z]{2,3}\d{2})\b"
    r"|(?P<letter>\([a-z]\))"
    r"|(?P<num>\d+(?:\.\d+)*)(?![\w])"
    r"|\"(?P<dq>[^\"\n]{1,80}(?:\n[ \t]*(?:#[ \t]*)?[^\"\n]{1,80})?)\"|'(?P<sq>[^'\n]{1,80})'"
)
_JOIN = re.compile(r"[ \t]*(?:,|\band\b|&|/)[ \t]*(?:§[ \t]*|sections?[ \t]+)?")
_NAME = re.compile(r"[A-Za-z][\w.&/-]*(?:[ \t]+[A-Za-z][\w.&/-]*){0,3}")
_OUTSIDE = ("reference/", "shared/", "/work/", "../")


@dataclass
class Notes:
    """The anchors of one ``docs/<name>.md``: id -> searchable text (heading or the words after it)."""

    anchors: dict[str, str]

    @classmethod
    def load(cls, path: Path) -> Notes:
        """Read the explicit ``<a id>`` anchors (with their heading text) and heading slugs of a notes file."""
        anchors: dict[str, str] = {}
        if not path.is_file():
            return cls(anchors)
        for line in path.read_text(encoding="utf-8").splitlines():
            for m in re.finditer(r'<a\s+(?:id|name)="([^"]+)"\s*>\s*</a>', line):
                anchors.setdefault(m.group(1), _plain(line[m.end():])[:160].lower())
            if line.startswith("#"):
                text = _plain(line.lstrip("#"))
                anchors.setdefault(slug(text), text.lower())
        return cls(anchors)


def _plain(text: str) -> str:
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[*`_\[\]]", "", html.unescape(text))
    return text.strip()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = _plain(heading).lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def numbered(name: str, token: str) -> str | None:
    """An old section or detector number mapped to our anchor; ``6.2.1`` falls back to ``6.2`` then ``6``."""
    table = NUMBERED.get(name, {})
    t = token
    while t:
        if t in table:
            return table[t]
        t = t.rpartition(".")[0]
    return None


def by_words(name: str, text: str, notes: Notes) -> str | None:
    """A section name or phrase mapped to an anchor: an anchor of that name, an alias, a heading."""
    low = " ".join(text.split()).lower()
    if not low:
        return None
    if low in notes.anchors or slug(low) in notes.anchors:
        return low if low in notes.anchors else slug(low)
    for pat, anchor in ALIASES.get(name, ()):
        if re.search(pat, low) and anchor in notes.anchors:
            return anchor
    if len(low) >= 4:
        for anchor, heading in notes.anchors.items():
            if low in heading:
                return anchor
    return None


def by_name(name: str, words: str, notes: Notes) -> tuple[str, str] | None:
    """A bare section name after ``:`` or ``§`` (1-4 words, longest first): (anchor, the words used).

    Stricter than :func:`by_words` because the words may be the start of a sentence: the candidate must
    be an anchor, match an alias pattern whole, or be part of a heading.
    """
    parts = words.split()
    for k in range(min(4, len(parts)), 0, -1):
        cand = " ".join(parts[:k]).rstrip(".")
        low = cand.lower()
        if slug(low) in notes.anchors:
            return slug(low), cand
        for pat, anchor in ALIASES.get(name, ()):
            if re.fullmatch(pat, low) and anchor in notes.anchors:
                return anchor, cand
        if len(low) >= 4:
            for anchor, heading in notes.anchors.items():
                if re.search(r"(?<!\w)" + re.escape(low) + r"(?!\w)", heading):
                    return anchor, cand
    return None


def context(text: str, start: int, end: int) -> str:
    """The sentence around a citation (at most 300 characters each side)."""
    lo = max(text.rfind(". ", 0, start), text.rfind(".\n", 0, start), text.rfind("\n\n", 0, start), start - 300)
    his = [i for i in (text.find(". ", end), text.find(".\n", end), text.find("\n\n", end)) if i >= 0]
    hi = min([end + 300, *his])
    return text[max(lo, 0):hi]


@dataclass
class Change:
    """One rewritten (or unmappable) citation."""

    path: str
    line: int
    old: str
    new: str
    problem: str | None = None


def _tokens(text: str, pos: int, name: str, notes: Notes) -> tuple[list[tuple[str, str]], int]:
    """Section tokens right after a citation: [(kind, value)] and the offset where they end.

    Kinds: ``d`` (``D13``), ``code`` (``SP01``), ``letter`` (``(b)``), ``num`` (``6.2``), ``quote``
    (``"Partial writes"``), ``name`` (``: Megatron``, only when it names a section). Tokens may be
    joined by ``,``, ``and``, ``&`` or ``/``. No token: ``([], pos)``.
    """
    intro = _INTRO.match(text, pos)
    if intro is None or intro.end() == pos:
        return [], pos
    at = intro.end()
    m = _TOKEN.match(text, at)
    if m is None:
        if intro.group("punct") == ":" or intro.group("kw"):
            n = _NAME.match(text, at)
            hit = by_name(name, n.group(0), notes) if n else None
            if hit:
                return [("name", hit[1])], at + len(hit[1])
        return [], pos
    toks: list[tuple[str, str]] = []
    while m is not None:
        kind = m.lastgroup or ""
        value = m.group(kind)
        kind = {"dq": "quote", "sq": "quote", "pd": "d"}.get(kind, kind)
        toks.append((kind, value))
        at = m.end()
        j = _JOIN.match(text, at)
        m = _TOKEN.match(text, j.end()) if j is not None and j.end() > at else None
    return toks, at


def _anchor(name: str, kind: str, value: str, notes: Notes) -> str | None:
    if kind in ("d", "num", "letter"):
        a = numbered(name, value)
        return a if a is None or a in notes.anchors or not notes.anchors else None
    if kind == "code":
        return value.lower() if value.lower() in notes.anchors else None
    return by_words(name, value, notes)


def rewrite_text(text: str, rel: str, notes: dict[str, Notes]) -> tuple[str, list[Change]]:
    """Rewrite every old-style citation of ``text``; returns the new text and what changed."""
    out: list[str] = []
    changes: list[Change] = []
    last = 0
    for m in _CITE.finditer(text):
        prefix, name = m.group("prefix"), m.group("name")
        if prefix and not prefix.endswith("docs/") and not any(o in prefix for o in _OUTSIDE):
            continue  # some other file of that name
        if m.group("frag") and prefix == "docs/":
            continue  # already in our form
        open_, close = m.group("open") or "", m.group("close") or ""
        start, end = m.start(), m.end()
        if open_ != close:  # unbalanced backticks belong to the surrounding text
            start, end = start + len(open_), end - len(close)
            open_ = close = ""
        toks, tok_end = _tokens(text, end, name, notes[name])
        anchors: list[str] = []
        unmapped: list[str] = []
        keep_words = False
        for kind, value in toks:
            a = _anchor(name, kind, value, notes[name])
            if kind == "quote" and len(value.split()) > 4:
                keep_words = True  # a quoted phrase, not a section name: it finds the section and stays
            if a is None:
                unmapped.append(" ".join(value.split()))
            elif kind == "quote" and anchors:
                anchors[-1] = a  # 6.2, "Partial writes": the named subsection is the more precise one
            elif a not in anchors:
                anchors.append(a)
        if not toks and name == "tiny-runs" and not prefix.endswith("docs/"):
            a = by_words(name, context(text, start, end), notes[name])
            anchors += [a] if a else []
        frag = m.group("frag") or ""
        if unmapped:
            anchors, keep_words = [], True
        if anchors:
            new = " and ".join(f"{open_}docs/{name}.md#{a}{close}" for a in anchors)
        else:
            new = f"{open_}docs/{name}.md{frag}{close}"
        stop = end
        if toks and not keep_words:
            stop = tok_end
            eaten = text[end:tok_end]
            if "\n" in eaten:  # keep the line break the eaten words spanned, after closing punctuation
                punct = re.match(r"[)\]},.;:]*", text[stop:]).group(0)  # type: ignore[union-attr]
                new += punct + re.match(r"\n[ \t]*(?:#[ \t]*)?", eaten[eaten.rfind("\n"):]).group(0)  # type: ignore[union-attr]
                stop += len(punct)
                while stop < len(text) and text[stop] in " \t":
                    stop += 1
        old = text[start:stop]
        out.append(text[last:start] + new)
        last = stop
        line = text.count("\n", 0, start) + 1
        if unmapped:
            changes.append(Change(rel, line, old, new, f"UNMAPPED section {', '.join(unmapped)!r} of {name}.md, "
                                  "left after the docs/ path"))
        elif old != new:
            changes.append(Change(rel, line, old, new, None if anchors or frag else "note: no section, whole file"))
    out.append(text[last:])
    return "".join(out), changes


def files(root: Path) -> list[Path]:
    """The ``*.py`` and ``*.md`` files under :data:`ROOTS` and the top-level README, sorted."""
    out: list[Path] = [root / "README.md"] if (root / "README.md").is_file() else []
    for r in ROOTS:
        base = root / r
        if base.is_dir():
            out += [p for p in base.rglob("*") if p.suffix in (".py", ".md") and p.is_file()]
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with ``--check`` only report) the citations under the repository root."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--check", action="store_true", help="report only; exit 1 if anything would change")
    args = ap.parse_args(argv)
    root: Path = args.root
    notes = {n: Notes.load(root / "docs" / f"{n}.md") for n in NOTES}
    missing = [n for n, v in notes.items() if not v.anchors]
    if missing:
        print(f"warning: docs/{', docs/'.join(missing)}.md missing or without anchors", file=sys.stderr)
    n_files = n_changes = n_problems = 0
    for path in files(root):
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{rel}: not read ({exc})")
            continue
        if SKIP_MARK in text:
            continue
        new, changes = rewrite_text(text, rel, notes)
        for c in changes:
            n_problems += bool(c.problem and c.problem.startswith("UNMAPPED"))
            what = f"{c.problem}: " if c.problem else ""
            print(f"{c.path}:{c.line}: {what}{' '.join(c.old.split())!r} -> {' '.join(c.new.split())!r}")
        if new == text:
            continue
        if path.suffix == ".py":
            try:
                compile(new, rel, "exec")
            except SyntaxError as exc:
                n_problems += 1
                print(f"{rel}: NOT rewritten, the result would not compile ({exc})")
                continue
        too_long = [i + 1 for i, ln in enumerate(new.splitlines()) if len(ln) > 120
                    and i < len(text.splitlines()) and len(text.splitlines()[i]) <= 120]
        for i in too_long:
            print(f"{rel}:{i}: note: line now longer than 120 characters")
        n_files += 1
        n_changes += sum(1 for c in changes if c.old != c.new and not (c.problem or "").startswith("UNMAPPED"))
        if not args.check:
            path.write_text(new, encoding="utf-8")
    verb = "would rewrite" if args.check else "rewrote"
    print(f"{verb} {n_changes} citation(s) in {n_files} file(s); {n_problems} to look at")
    return 1 if args.check and (n_files or n_problems) else 0


if __name__ == "__main__":
    sys.exit(main())
