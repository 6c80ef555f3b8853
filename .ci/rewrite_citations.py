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

1. the old notes' section and detector numbers (:data:`NUMBERED`, from ``.ci/citation_map.json``; ``D13`` -> ``dv01``,
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
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("forensics", "parsers", "reports", "benchmarks", "sample_logs", "tests")
"""Folders (relative to the repository root) whose ``*.py`` and ``*.md`` files are rewritten."""
SKIP_MARK = "rewrite-citations: skip"
NOTES = ("detectors", "formats", "tiny-runs")

_MAP = json.loads((Path(__file__).with_name("citation_map.json")).read_text(encoding="utf-8"))
NUMBERED: dict[str, dict[str, str]] = _MAP["numbered"]
"""Section and detector numbers of the old notes -> our anchors (``.ci/citation_map.json``)."""
ALIASES: dict[str, list[tuple[str, str]]] = {k: [tuple(x) for x in v] for k, v in _MAP["aliases"].items()}
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


def _resolve(name: str, toks: list[tuple[str, str]], notes: Notes) -> tuple[list[str], list[str], bool]:
    """Anchors for the section tokens of one citation.

    Returns the anchors, the tokens that map to nothing, and whether the cited words must stay in the
    text (a quoted phrase, or anything unmapped).
    """
    anchors: list[str] = []
    unmapped: list[str] = []
    keep_words = False
    for kind, value in toks:
        a = _anchor(name, kind, value, notes)
        if kind == "quote" and len(value.split()) > 4:
            keep_words = True  # a quoted phrase, not a section name: it finds the section and stays
        if a is None:
            unmapped.append(" ".join(value.split()))
        elif kind == "quote" and anchors:
            anchors[-1] = a  # 6.2, "Partial writes": the named subsection is the more precise one
        elif a not in anchors:
            anchors.append(a)
    return ([], unmapped, True) if unmapped else (anchors, unmapped, keep_words)


def _eat(text: str, end: int, tok_end: int) -> tuple[str, int]:
    """What replaces the eaten section words, and where the text resumes.

    The replacement is empty, or the line break the words spanned (after any closing punctuation).
    """
    eaten, stop = text[end:tok_end], tok_end
    if "\n" not in eaten:
        return "", stop
    punct = re.match(r"[)\]},.;:]*", text[stop:]).group(0)  # type: ignore[union-attr]
    brk = re.match(r"\n[ \t]*(?:#[ \t]*)?", eaten[eaten.rfind("\n"):]).group(0)  # type: ignore[union-attr]
    stop += len(punct)
    while stop < len(text) and text[stop] in " \t":
        stop += 1
    return punct + brk, stop


def rewrite_text(text: str, rel: str, notes: dict[str, Notes]) -> tuple[str, list[Change]]:
    """Rewrite every old-style citation of ``text``; returns the new text and what changed."""
    out: list[str] = []
    changes: list[Change] = []
    last = 0
    for m in _CITE.finditer(text):
        prefix, name, frag = m.group("prefix"), m.group("name"), m.group("frag") or ""
        if prefix and not prefix.endswith("docs/") and not any(o in prefix for o in _OUTSIDE):
            continue  # some other file of that name
        if frag and prefix == "docs/":
            continue  # already in our form
        open_, close = m.group("open") or "", m.group("close") or ""
        start, end = m.start(), m.end()
        if open_ != close:  # unbalanced backticks belong to the surrounding text
            start, end = start + len(open_), end - len(close)
            open_ = close = ""
        toks, tok_end = _tokens(text, end, name, notes[name])
        anchors, unmapped, keep_words = _resolve(name, toks, notes[name])
        if not toks and name == "tiny-runs" and not prefix.endswith("docs/"):
            a = by_words(name, context(text, start, end), notes[name])
            anchors += [a] if a else []
        new = " and ".join(f"{open_}docs/{name}.md#{a}{close}" for a in anchors)
        new = new or f"{open_}docs/{name}.md{frag}{close}"
        stop = end
        if toks and not keep_words:
            tail, stop = _eat(text, end, tok_end)
            new += tail
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
