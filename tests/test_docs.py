# rewrite-citations: skip  (this file spells old-style citations on purpose, as test input)
"""The reference notes in ``docs/`` and the citations of them in the code.

Every ``docs/<file>.md#<anchor>`` cited by code must name an existing file and anchor; nothing cites the
research notes outside the repository (absolute machine paths, ``shared/reference``) or a bare
``detectors.md`` without its ``docs/`` path; every detector code has a section in ``docs/detectors.md``;
the links inside ``docs/`` resolve; and ``.ci/rewrite_citations.py`` maps old-style citations, reports
what it cannot map and is idempotent.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CODE_DIRS = ("forensics", "parsers", "reports", "benchmarks", "sample_logs", "tests", ".ci")
SKIP_MARK = "rewrite-citations: " + "skip"
NOTE_NAMES = ("detectors", "formats", "tiny-runs")

CITATION = re.compile(r"(?<![\w/.-])docs/(?P<file>[\w-]+\.md)(?:#(?P<anchor>[\w-]+))?")
BARE = re.compile(r"(?<![\w-])(?P<path>[\w./~-]*?)(?P<name>" + "|".join(NOTE_NAMES) + r")\.md\b")
OLD_SECTION = re.compile(r"`*[ \t]*[,:]?[ \t]*(?:§|sections?\b|sec\.|D\d{1,2}\b|\d+\.\d+\b|\([a-z]\))")
OUTSIDE = re.compile(r"shared/reference|/work/[\w./~-]*\.md\b")
"""A citation of notes outside the repository: the research notes, or any markdown file under /work/ (data
paths such as a default corpus location are not citations and are not judged here)."""


def code_files() -> list[Path]:
    """The source and documentation files of the code (not ``docs/``), minus the marked ones."""
    out = [ROOT / "README.md"]
    for d in CODE_DIRS:
        base = ROOT / d
        if base.is_dir():
            out += [p for p in base.rglob("*") if p.is_file() and p.suffix in (".py", ".md")]
    return sorted(p for p in out if p.is_file() and SKIP_MARK not in p.read_text(encoding="utf-8", errors="replace"))


def _plain(text: str) -> str:
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[*`_\[\]]", "", text).strip()


def anchors_of(path: Path) -> set[str]:
    """Explicit ``<a id>``/``<a name>`` anchors and GitHub heading slugs of a markdown file."""
    out: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        out.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', line))
        if line.startswith("#"):
            s = re.sub(r"[^\w\- ]", "", _plain(line.lstrip("#")).lower())
            out.add(s.replace(" ", "-"))
    return out


def _where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}"


def test_docs_files_exist_and_are_indexed():
    """The notes exist, and the index links each of them."""
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for name in NOTE_NAMES:
        assert (DOCS / f"{name}.md").is_file(), f"docs/{name}.md missing"
        assert f"({name}.md)" in index, f"docs/README.md does not link {name}.md"


def test_every_docs_citation_in_the_code_resolves():
    """``docs/<file>.md#<anchor>`` in code names an existing file and an existing anchor or heading."""
    anchors = {p.name: anchors_of(p) for p in DOCS.glob("*.md")}
    bad, seen = [], 0
    for path in code_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in CITATION.finditer(text):
            seen += 1
            f, a = m.group("file"), m.group("anchor")
            if f not in anchors:
                bad.append(f"{_where(path, text, m.start())}: docs/{f} does not exist")
            elif a and a not in anchors[f]:
                bad.append(f"{_where(path, text, m.start())}: docs/{f} has no anchor #{a}")
            elif not a and OLD_SECTION.match(text, m.end()):
                bad.append(f"{_where(path, text, m.start())}: docs/{f} followed by an old section number "
                           f"{text[m.end():m.end() + 30]!r} (cite an anchor; see .ci/rewrite_citations.py)")
    assert seen > 0, "no docs/ citation found in the code at all"
    assert not bad, "broken citations:\n" + "\n".join(bad)


def test_no_code_cites_notes_outside_the_repository():
    """No notes cited by a machine path or ``shared/reference``; no bare ``detectors.md`` & co."""
    bad = []
    for path in code_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in OUTSIDE.finditer(text):
            bad.append(f"{_where(path, text, m.start())}: cites a path outside the repository: "
                       f"{text[m.start():m.start() + 60]!r}")
        for m in BARE.finditer(text):
            if m.group("path") != "docs/":
                bad.append(f"{_where(path, text, m.start())}: {m.group(0)!r} without the docs/ path "
                           "(run .ci/rewrite_citations.py)")
    assert not bad, "\n".join(bad)


def _detector_codes() -> set[str]:
    from forensics.detectors import DETECTORS
    from forensics.engine.codes import ENGINE_FINDINGS

    codes = {d.code for d in DETECTORS} | set(ENGINE_FINDINGS)  # the engine's own findings (ENG01, INT02, DV02)
    # findings made outside the registry carry their code as a literal
    for path in (ROOT / "forensics").rglob("*.py"):
        codes.update(re.findall(r"\bcode\s*=\s*[\"']([A-Z]{2,4}\d{2})[\"']", path.read_text(encoding="utf-8")))
    return codes


def test_every_detector_code_has_a_section():
    """Each registry code (and each code the engine makes itself) has ``docs/detectors.md#<code>``."""
    anchors = anchors_of(DOCS / "detectors.md")
    codes = _detector_codes()
    assert len(codes) >= 20
    missing = sorted(c for c in codes if c.lower() not in anchors)
    assert not missing, f"docs/detectors.md has no section for {missing}"


def test_links_inside_docs_resolve():
    """Markdown links between the notes (``](file.md#a)``, ``](#a)``) point at existing anchors."""
    anchors = {p.name: anchors_of(p) for p in DOCS.glob("*.md")}
    bad = []
    for path in DOCS.glob("*.md"):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"\]\((?P<file>[\w-]+\.md)?(?:#(?P<anchor>[\w-]+))?\)", text):
            f = m.group("file") or path.name
            a = m.group("anchor")
            if f not in anchors or (a and a not in anchors[f]):
                bad.append(f"{_where(path, text, m.start())}: {m.group(0)}")
    assert not bad, "broken links in docs/:\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def rewriter():
    """The ``.ci/rewrite_citations.py`` module and the anchors of our notes."""
    spec = importlib.util.spec_from_file_location("rewrite_citations", ROOT / ".ci" / "rewrite_citations.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rewrite_citations"] = mod
    spec.loader.exec_module(mod)
    notes = {n: mod.Notes.load(DOCS / f"{n}.md") for n in mod.NOTES}
    return mod, notes


@pytest.mark.parametrize("old, new", [
    ("Rule (detectors.md D13: slow", "Rule (docs/detectors.md#dv01: slow"),
    ("Rule (detectors.md §SP01): x", "Rule (docs/detectors.md#sp01): x"),
    ("(/work/shared/reference/detectors.md section 3.3 and D2). E",
     "(docs/detectors.md#loss-scalers and docs/detectors.md#ov01). E"),
    ("Conventions of ``shared/reference/detectors.md`` section (b): a",
     "Conventions of ``docs/detectors.md#conventions``: a"),
    ("(shared/reference/detectors.md, \"Recovery-trial recipe\"):", "(docs/detectors.md#recovery-trial):"),
    ("reference/formats.md section 4.1.", "docs/formats.md#megatron."),
    ("see formats.md: Megatron prints", "see docs/formats.md#megatron prints"),
    ("(``formats.md`` 2.2; wandb", "(``docs/formats.md#wandb-framing``; wandb"),
    ("(formats.md 6.2, \"Partial\n    writes\"), and", "(docs/formats.md#torch-zip-partial),\n    and"),
    ("formats.md:\n    \"a constant, not a collapsed fp16 scale\")",
     "docs/formats.md#bf16-loss-scale:\n    \"a constant, not a collapsed fp16 scale\")"),
    ("# fp16 evidence tells an overflow from growth (tiny-runs.md)",
     "# fp16 evidence tells an overflow from growth (docs/tiny-runs.md#overflow)"),
    ("see detectors.md (D15) here", "see docs/detectors.md#cross-run-audit here"),
    ("see formats.md: the layout", "see docs/formats.md: the layout"),
    ("``docs/detectors.md#sp01`` stays", "``docs/detectors.md#sp01`` stays"),
    ("the fp16 runs of `docs/tiny-runs.md` stay whole", "the fp16 runs of `docs/tiny-runs.md` stay whole"),
    ("parsers/formats.md is another file", "parsers/formats.md is another file"),
])
def test_rewrite_maps_old_citations(rewriter, old, new):
    """Old section numbers, detector numbers, codes and names become anchors; twice is the same as once."""
    mod, notes = rewriter
    got, _ = mod.rewrite_text(old, "x.py", notes)
    assert got == new
    again, changes = mod.rewrite_text(got, "x.py", notes)
    assert again == got and not [c for c in changes if c.old != c.new]


def test_rewrite_reports_what_it_cannot_map(rewriter):
    """An unknown section keeps its words after the docs/ path and is reported, not guessed."""
    mod, notes = rewriter
    got, changes = mod.rewrite_text("(detectors.md section 9.9)", "x.py", notes)
    assert got == "(docs/detectors.md section 9.9)"
    assert changes and changes[0].problem and changes[0].problem.startswith("UNMAPPED")
    assert OLD_SECTION.match(got, got.index(".md") + 3)  # and the citation test flags what is left


def test_rewrite_has_nothing_left_to_do_on_this_tree(rewriter, capsys):
    """After the rewrite was committed, ``--check`` finds nothing to change and nothing unmapped."""
    mod, _ = rewriter
    rc = mod.main(["--check", "--root", str(ROOT)])
    out = capsys.readouterr().out
    assert rc == 0, out
