"""A folder given to ``analyze`` that holds several separate runs, not one run's restarts.

``forensics analyze FOLDER`` reads everything under FOLDER as one run, so the run folders of a sweep or
of two unrelated launches become "segments" of one run. The audit's run discovery
(:func:`forensics.layout.find_runs`) already finds run folders; it cannot tell a relaunch in a new
folder (a segment) from a separate run, and neither can this module for certain. The sign used here:
two or more run folders whose logs start at the same first step. A resume continues from a checkpoint
(a later step); a second run, or a relaunch from scratch, starts again at the first step. The CLI then
names the folders and suggests ``audit`` (each run on its own) or ``compare``; the analysis itself is
unchanged, so a relaunch from scratch loses nothing.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import polars as pl

from forensics.errors import ForensicsError
from forensics.rundata import RunData


def separate_runs(run_dir: Path, run: RunData) -> list[str]:
    """The run folders under ``run_dir`` that look like separate runs (module docstring), relative, sorted.

    Args:
        run_dir: The folder given to ``analyze`` (a file gives ``[]``).
        run: Its loaded data; ``source`` paths are relative to ``run_dir``.

    Returns:
        Two or more folder names (relative to ``run_dir``) whose first logged step is the same, or ``[]``.
        Never raises: a folder that cannot be walked gives ``[]``.
    """
    if not run_dir.is_dir() or run.metrics.height == 0:
        return []
    if len({PurePosixPath(src.path).parent for src in run.sources}) < 2:
        return []  # every log in one folder: one run, and no second walk of the folder
    from forensics.layout import find_runs
    from parsers import file_policy

    try:
        folders = [file_policy.display(p.relative_to(run_dir).as_posix()) for p in find_runs(run_dir)]  # as sources
    except (ForensicsError, OSError, ValueError):
        return []
    if len(folders) < 2 or "." in folders:
        return []
    first = (run.metrics.group_by("source").agg(pl.col("step").min())
             .with_columns(pl.col("source").cast(pl.String)))
    start: dict[str, int] = {}
    for source, step in first.iter_rows():
        folder = _owner(PurePosixPath(source), folders)
        if folder is not None and step is not None:
            start[folder] = min(step, start.get(folder, step))
    by_step: dict[int, list[str]] = {}
    for folder, step in start.items():
        by_step.setdefault(step, []).append(folder)
    same = max(by_step.values(), key=len, default=[])
    return sorted(same) if len(same) >= 2 else []


def _owner(source: PurePosixPath, folders: list[str]) -> str | None:
    """The deepest run folder that holds ``source``."""
    best = None
    for folder in folders:
        if source.is_relative_to(folder) and (best is None or len(folder) > len(best)):
            best = folder
    return best


def note(run_dir: Path, folders: list[str]) -> str:
    """The one-line note the CLI prints on stderr for :func:`separate_runs`'s folders (terminal-safe)."""
    from forensics.cli_common import shown as safe

    shown = ", ".join(safe(f) for f in folders[:4]) + (f" and {len(folders) - 4} more" if len(folders) > 4 else "")
    run_dir = safe(run_dir)
    return (f"note: {run_dir} holds {len(folders)} run folders that each start at the same step ({shown}); "
            f"they were analysed as one run with restarts. `forensics audit {run_dir}` analyses each run, "
            "`forensics compare A B` compares two.")
