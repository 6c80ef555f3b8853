"""How the reader does on real, published training runs: read, objective found, verdicts, per framework.

Every run folder under the given corpus roots is analyzed as a user would (``forensics analyze RUN -f json``
in a subprocess, one per run, with a timeout), and, where it was read, ingested (``forensics ingest RUN -o
TMP``) to see which metric series came out. Prints one row per framework (``--markdown`` for a Markdown
table; ``--runs`` adds one row per run; ``--json PATH`` writes the per-run rows):

- ``runs``: run folders found;
- ``read``: exit status other than 2 and at least one record read (the sum of ``sources[].records``);
- ``objective``: the training objective was read: the reader's own statement where its JSON has one
  (``meta.objective``), else a ``metric == "loss"`` series in ``metrics.parquet``; ``lab.obj``: runs whose
  label names a training objective (the others hold none: a predict-only run, a crash at start-up);
  ``obj/lab.obj``: of those, objective found;
- ``healthy``/``anomaly``/``transient``/``inconclusive``/``error``: the verdicts given (``error``: exit 2
  or no JSON object);
- ``lab.healthy``: runs labelled healthy by their source; ``h->anomaly``: of those, called ``anomaly``;
- ``healthy w/o loss``: ``healthy`` verdicts given although no ``loss`` series was read;
- ``lab.anomaly``: runs whose log itself shows a failure; ``a->anomaly``: of those, called anomaly or transient.

Frameworks are counted by name per corpus; the ``all`` rows count distinct names (a name in two corpora
counts once).

Layout of a corpus root: ``<root>/<framework>/<run>/`` (``../shared/realruns``); a root holding ``tune/``
and ``holdout/`` folders (``/work/realcorpus``) is read as ``<root>/<split>/<framework>/<run>/``. Labels
come from the nearest ``labels.json`` at or above the framework folders, keyed by the run's path relative
to that file's folder (``{"verdict": "healthy" | "anomaly" | "unknown", "objective": str | null}``).

Usage::

    python benchmarks/realruns_table.py [ROOT ...] [--timeout 180] [--jobs 1] [--markdown] [--runs]
        [--json rows.json] [--no-ingest] [--framework NAME ...] [--code CHECKOUT]

Default roots: ``../shared/realruns`` (beside the repository) and ``/work/realcorpus`` (or
``$FORENSICS_REALCORPUS``), those that exist. The exit status is always 0: a measurement, not a gate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS = [REPO.parent / "shared" / "realruns", Path(os.environ.get("FORENSICS_REALCORPUS", "/work/realcorpus"))]
SPLITS = ("tune", "holdout")
VERDICTS = ("healthy", "anomaly", "transient", "inconclusive", "error")


@dataclass
class Run:
    """One run folder and what its source says about it."""

    path: Path
    corpus: str
    split: str
    framework: str
    name: str
    label: str | None = None
    label_objective: str | None = None


@dataclass
class Row:
    """What the tool did on one run."""

    corpus: str
    split: str
    framework: str
    run: str
    path: str
    label: str | None
    label_objective: str | None
    exit: int | None = None
    verdict: str = "error"
    records: int = 0
    read: bool = False
    objective: bool = False
    metrics: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    skipped: int = 0
    error: str | None = None
    seconds: float = 0.0


def _labels_for(root: Path) -> tuple[Path, dict[str, Any]]:
    for d in (root, root.parent):
        f = d / "labels.json"
        if f.is_file():
            try:
                return d, json.loads(f.read_text())
            except (OSError, ValueError):
                return d, {}
    return root, {}


def discover(roots: list[Path]) -> list[Run]:
    """Run folders under each corpus root (``framework/run``, or ``split/framework/run``).

    Args:
        roots: corpus roots; missing ones are skipped with a note on stderr.

    Returns:
        The runs, sorted by corpus, split, framework and name.
    """
    runs: list[Run] = []
    for root in roots:
        root = root.resolve()
        if not root.is_dir():
            print(f"note: corpus root {root} not found; skipped", file=sys.stderr)
            continue
        if root.name in SPLITS:
            parts = [(root.name, root)]
            corpus = root.parent.name
        elif any((root / s).is_dir() for s in SPLITS):
            parts = [(s, root / s) for s in SPLITS if (root / s).is_dir()]
            corpus = root.name
        else:
            parts = [("-", root)]
            corpus = root.name
        for split, base in parts:
            label_dir, labels = _labels_for(base)
            for fw in sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")):
                if fw.name in ("tools",):
                    continue
                for run in sorted(p for p in fw.iterdir() if p.is_dir()):
                    key = run.relative_to(label_dir).as_posix()
                    lab = labels.get(key) or {}
                    runs.append(Run(run, corpus, split, fw.name, run.name, lab.get("verdict"), lab.get("objective")))
    return runs


def _forensics_cmd() -> list[str]:
    exe = shutil.which("forensics")
    return [exe] if exe else [sys.executable, "-m", "forensics.cli"]


CODE = REPO  # whose code the subprocesses run (--code)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    env["PYTHONPATH"] = os.pathsep.join([str(CODE), *rest])
    return env


def _objective_from_json(doc: dict[str, Any]) -> bool | None:
    """The reader's own statement that the objective was read, where its JSON has one (newer readers).

    ``meta.objective`` (the series taken as the objective, null when none), or a top-level ``objective`` /
    ``coverage.objective``; None when the JSON says nothing about it (today's reader).
    """
    meta = doc.get("meta")
    if isinstance(meta, dict) and "objective" in meta:
        return bool(meta["objective"])
    for key in ("coverage", "objective"):
        v = doc.get(key)
        if isinstance(v, dict):
            for k in ("objective", "loss", "objective_found"):
                if isinstance(v.get(k), bool):
                    return v[k]
                if isinstance(v.get(k), str):
                    return True
        elif isinstance(v, bool):
            return v
    return None


def measure(run: Run, timeout: float, ingest: bool) -> Row:
    """Analyze (and ingest) one run in subprocesses.

    Args:
        run: the run folder.
        timeout: seconds allowed to each subprocess; a run past it counts as an error.
        ingest: also run ``forensics ingest`` to list the metric names read.

    Returns:
        The row; never raises for the tool's failures (they are the measurement).
    """
    row = Row(run.corpus, run.split, run.framework, run.name, str(run.path), run.label, run.label_objective)
    t0 = time.perf_counter()
    cmd = _forensics_cmd()
    try:
        p = subprocess.run([*cmd, "analyze", str(run.path), "-f", "json"], capture_output=True, text=True,
                           timeout=timeout, env=_env(), stdin=subprocess.DEVNULL)
        row.exit = p.returncode
        doc: dict[str, Any] | None = None
        stated: bool | None = None
        try:
            doc = json.loads(p.stdout) if p.stdout.strip() else None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "error" not in doc:
            row.verdict = str(doc.get("verdict", "error"))
            srcs = doc.get("sources") or []
            row.records = sum(int(s.get("records") or 0) for s in srcs if isinstance(s, dict))
            row.formats = sorted({str(s.get("format")) for s in srcs if isinstance(s, dict)})
            row.skipped = len(doc.get("skipped") or [])
            stated = _objective_from_json(doc)
        else:
            err = doc.get("error") if isinstance(doc, dict) else None
            msg = (err or {}).get("message") if isinstance(err, dict) else None
            tail = p.stderr.strip().splitlines()[-1:]
            row.error = (msg or (tail[0] if tail else "no output"))[:300]
        row.read = row.exit != 2 and row.records > 0
        if stated is not None:
            row.objective = stated and row.read
        if ingest and row.read:
            with tempfile.TemporaryDirectory(prefix="realruns-") as tmp:
                q = subprocess.run([*cmd, "ingest", str(run.path), "-o", tmp], capture_output=True, text=True,
                                   timeout=timeout, env=_env(), stdin=subprocess.DEVNULL)
                mp = Path(tmp) / "metrics.parquet"
                if q.returncode == 0 and mp.is_file():
                    import polars as pl

                    names = pl.read_parquet(mp, columns=["metric"])["metric"].unique().sort().to_list()
                    row.metrics = [str(n) for n in names]
                    if stated is None:
                        row.objective = "loss" in row.metrics
    except subprocess.TimeoutExpired:
        row.error = f"timeout after {timeout:.0f} s"
        row.verdict = "error"
    row.seconds = round(time.perf_counter() - t0, 2)
    return row


def summarize(rows: list[Row]) -> list[dict[str, Any]]:
    """Per-framework counts (and a total row), in the order the table prints them."""
    groups: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.corpus, r.split, r.framework)].append(r)

    def count(rs: list[Row], key: tuple[str, str, str]) -> dict[str, Any]:
        labelled = [r for r in rs if r.label_objective]
        d: dict[str, Any] = {"corpus": key[0], "split": key[1], "framework": key[2], "runs": len(rs),
                             "read": sum(r.read for r in rs), "objective": sum(r.objective for r in rs),
                             "lab.obj": len(labelled), "obj/lab.obj": sum(r.objective for r in labelled)}
        for v in VERDICTS:
            d[v] = sum((r.verdict if r.verdict in VERDICTS else "error") == v for r in rs)
        d["lab.healthy"] = sum(r.label == "healthy" for r in rs)
        d["h->anomaly"] = sum(r.label == "healthy" and r.verdict == "anomaly" for r in rs)
        d["healthy w/o loss"] = sum(r.verdict == "healthy" and not r.objective for r in rs)
        d["lab.anomaly"] = sum(r.label == "anomaly" for r in rs)
        d["a->anomaly"] = sum(r.label == "anomaly" and r.verdict in ("anomaly", "transient") for r in rs)
        return d

    out = [count(rs, k) for k, rs in sorted(groups.items())]
    parts: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        parts[(r.corpus, r.split)].append(r)
    if len(parts) > 1:
        for (corpus, split), rs in sorted(parts.items()):
            out.append(count(rs, (corpus, split, f"all ({len({r.framework for r in rs})} frameworks)")))
    out.append(count(rows, ("all", "", f"all ({len({r.framework for r in rows})} frameworks)")))
    return out


COLS = ["corpus", "split", "framework", "runs", "read", "objective", "lab.obj", "obj/lab.obj", *VERDICTS,
        "lab.healthy", "h->anomaly", "healthy w/o loss", "lab.anomaly", "a->anomaly"]
RUN_COLS = ["corpus", "split", "framework", "run", "label", "exit", "verdict", "records", "read", "objective",
            "formats", "error"]


def render(table: list[dict[str, Any]], cols: list[str], markdown: bool) -> str:
    """A plain or Markdown table of dict rows."""
    cells = [[("yes" if v is True else "no" if v is False else ",".join(v) if isinstance(v, list)
               else "" if v is None else str(v))[:120] for v in (r.get(c) for c in cols)] for r in table]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure every run under the roots and print the tables; always returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="*", type=Path, help="corpus roots (default: ../shared/realruns, /work/realcorpus)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per subprocess (default 180)")
    ap.add_argument("--jobs", type=int, default=1, help="runs measured at once (default 1)")
    ap.add_argument("--markdown", action="store_true", help="Markdown tables")
    ap.add_argument("--runs", action="store_true", help="also one row per run")
    ap.add_argument("--json", type=Path, help="write the per-run rows as JSON here")
    ap.add_argument("--no-ingest", action="store_true", help="skip `forensics ingest` (objective from the JSON only)")
    ap.add_argument("--framework", action="append", help="only these frameworks (repeatable)")
    ap.add_argument("--code", type=Path, default=REPO,
                    help="checkout whose forensics the subprocesses run (default: this one)")
    a = ap.parse_args(argv)
    global CODE
    CODE = a.code.resolve()
    runs = discover(a.roots or [r for r in DEFAULT_ROOTS if r.is_dir()])
    if a.framework:
        runs = [r for r in runs if r.framework in set(a.framework)]
    print(f"{len(runs)} runs; forensics = {' '.join(_forensics_cmd())} with code from {CODE}", file=sys.stderr)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        rows = list(ex.map(lambda r: measure(r, a.timeout, not a.no_ingest), runs))
    print(f"measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    if a.runs:
        print(render([asdict(r) for r in rows], RUN_COLS, a.markdown))
        print()
    print(render(summarize(rows), COLS, a.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
