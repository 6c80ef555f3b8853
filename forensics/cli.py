"""The ``forensics`` command line (click group).

Exit codes: 0 nothing at or above ``--fail-on``; 1 findings; 2 usage or input error; 3 inconclusive
(the training objective was not found: map it with ``--metric loss=COLUMN``).
Payload to stdout or ``-o``; the summary and progress to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from forensics import atomic
from forensics.cli_common import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    FORMATS,
    JsonErrorGroup,
    warn_unmatched,
)
from forensics.cli_common import emit as _emit
from forensics.cli_common import errors as _errors
from forensics.cli_common import fail as _fail
from forensics.cli_common import format_and_output as _format_and_output
from forensics.cli_common import metric_map as _metric_map
from forensics.cli_common import shown as _shown
from forensics.service.cli import serve, watch

__all__ = ["EXIT_ERROR", "EXIT_FINDINGS", "EXIT_INCONCLUSIVE", "EXIT_OK", "main"]
_FORMATS = FORMATS  # md = markdown; every command takes all of them

@click.group(cls=JsonErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="train-forensics")
def main() -> None:
    """Post-mortem analysis of deep-learning training runs."""


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-f", "--format", "fmt", type=click.Choice(_FORMATS), default="html", show_default=True,
              help="Report format.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Where to write the report (default: stdout; for html ./forensics-<run>.html).")
@click.option("--fail-on", type=click.Choice(["anomaly", "transient", "never"]), default="anomaly",
              show_default=True, help="Exit 1 when the verdict is at least this.")
@click.option("--strict", is_flag=True, help="Exit 2 when any input was skipped or damaged.")
@click.option("--metric", "metric_map", multiple=True, metavar="NAME=COLUMN",
              help="Say which logged series is a canonical metric, e.g. --metric loss=train/total (repeatable).")
@click.option("--follow-symlinks", is_flag=True,
              help="Follow symlinks that lead out of the run folder (default: not followed, listed as skipped).")
@click.option("--summary", is_flag=True,
              help="Also print the summary on stderr when the payload goes to stdout.")
@click.option("-v", "--verbose", is_flag=True, help="Text: list every finding, trial and skipped item.")
def analyze(run_dir: Path, fmt: str, output: Path | None, fail_on: str, strict: bool,
            metric_map: tuple[str, ...], follow_symlinks: bool, summary: bool, verbose: bool) -> None:
    """Diagnose one run folder: onset, cause, evidence, recovery trial."""
    fmt, output = _format_and_output(fmt, output)
    explicit_output = output is not None
    as_json = fmt == "json"
    try:
        mapping = _metric_map(metric_map)
    except click.BadParameter as exc:
        if not as_json:
            raise
        _fail(f"--metric: {exc.message}", json_error=("usage", run_dir))
    with _errors(run_dir, as_json=as_json):
        from forensics.api import analyze_run, load
        from parsers.file_policy import follow_symlinks as following
        from reports import ReportFormat, render

        with following(True if follow_symlinks else None):
            run = load(run_dir, mapping)
        warn_unmatched(run.meta.get("names") or {}, mapping)
        _note_separate_runs(run_dir, run)
        if strict and run.skipped:
            _fail(f"{run_dir}: --strict: {len(run.skipped)} input(s) skipped or damaged, first: "
                  f"{run.skipped[0].what}: {run.skipped[0].reason}",
                  json_error=("strict", run_dir) if as_json else None)
        analysis = analyze_run(run)
        html_path = None
        if fmt == "html" and output is None:
            output = Path(f"forensics-{Path(analysis.run).resolve().name or 'run'}.html")
        if fmt == "html":
            html_path = str(output)
        color = fmt == "text" and output is None and sys.stdout.isatty()
        payload = render(analysis, run, ReportFormat(fmt), html_path=html_path, color=color, verbose=verbose)
        if output is None:
            click.echo(payload, nl=not payload.endswith("\n"))
        else:
            atomic.write_text(output, payload)  # whole or absent; an error names the output
            if explicit_output and analysis.recovery is not None and output.is_file():  # not beside /dev/null
                trial_path = output.with_name(f"{output.stem}.recovery_trial.json")
                atomic.write_text(trial_path, json.dumps(analysis.recovery.to_dict(), indent=2, default=str) + "\n")
        if output is not None or summary:  # stdout is not the payload, or asked for
            click.echo(_text(analysis, run, color=sys.stderr.isatty(), verbose=verbose), err=True)
        if output is not None:
            click.echo(f"report written to {_shown(output)}", err=True)
    from forensics.model import Verdict  # not at the top: ``forensics --help`` stays fast

    if analysis.verdict == Verdict.INCONCLUSIVE:
        sys.exit(EXIT_INCONCLUSIVE)
    levels = {Verdict.HEALTHY: 0, Verdict.TRANSIENT: 1, Verdict.ANOMALY: 2}
    threshold = {"anomaly": 2, "transient": 1, "never": 99}[fail_on]
    sys.exit(EXIT_FINDINGS if levels[analysis.verdict] >= threshold else EXIT_OK)


def _note_separate_runs(run_dir: Path, run) -> None:  # noqa: ANN001
    """On stderr: RUN_DIR holds several runs that each start at the same step (``forensics.several_runs``)."""
    from forensics import several_runs

    folders = several_runs.separate_runs(run_dir, run)
    if folders:
        click.echo(several_runs.note(run_dir, folders), err=True)


def _text(analysis, run, *, color: bool, verbose: bool = False) -> str:  # noqa: ANN001
    from reports.text_report import render_text

    return render_text(analysis, color=color, run=run, verbose=verbose).rstrip("\n")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Folder for the tables.")
@click.option("--metric", "metric_map", multiple=True, metavar="NAME=COLUMN",
              help="Say which logged series is a canonical metric (repeatable).")
@click.option("--explain", is_flag=True, help="Also print, per file, the reader, the names and the skipped lines.")
def ingest(run_dir: Path, output: Path, metric_map: tuple[str, ...], explain: bool) -> None:
    """Write the run's Arrow tables as Parquet (metrics, events) plus run.json."""
    mapping = _metric_map(metric_map)
    with _errors(run_dir):
        from forensics.api import load

        run = load(run_dir, mapping)
        warn_unmatched(run.meta.get("names") or {}, mapping)
    with _errors(output):
        output.mkdir(parents=True, exist_ok=True)
        run.metrics.write_parquet(output / "metrics.parquet")
        run.events.write_parquet(output / "events.parquet")
        if run.tensors.height:
            run.tensors.write_parquet(output / "tensors.parquet")
        if run.updates.height:
            run.updates.write_parquet(output / "updates.parquet")
        meta = {
            "run": str(run.run), "meta": run.meta,
            "sources": [s.__dict__ for s in run.sources], "skipped": [s.__dict__ for s in run.skipped],
        }
        atomic.write_text(output / "run.json", json.dumps(meta, indent=2, default=str))
    click.echo(f"{run.metrics.height} metric rows, {run.events.height} events -> {output}", err=True)
    if explain:
        click.echo(_explain(run))


def _explain(run) -> str:  # noqa: ANN001
    """Per file: the reader, records, segments; what each raw name became and why; skips; the objective."""
    lines = []
    by_source = run.meta.get("by_source") or {}
    names = run.meta.get("names") or {}
    tags_by_source: dict[str, list[str]] = {}
    if run.metrics.height:
        for src, tag in run.metrics.select("source", "tag").unique().sort(["source", "tag"]).iter_rows():
            tags_by_source.setdefault(src, []).append(tag)
    for s in run.sources:
        lines.append(f"{s.path}: read by {s.format}, {s.records} records, {s.segments} segment(s)")
        meta = by_source.get(s.path) or {}
        for k in ("framework", "step_unit", "total_steps", "skipped_lines", "ranks", "units"):
            if meta.get(k):
                lines.append(f"  {k}: {meta[k]}")
        for tag in tags_by_source.get(s.path, []):
            if tag in names:
                lines.append(f"  {tag!r} -> {names[tag]['metric']!r}: {names[tag]['why']}")
    for sk in run.skipped:
        lines.append(f"skipped {sk.what}: {sk.reason}")
    obj = run.meta.get("objective")
    lines.append(f"objective: {obj['metric']} ({obj['why']})" if obj else
                 "objective: none found (the verdict would be inconclusive; map one with --metric loss=COLUMN)")
    return "\n".join(lines)


@main.command()
def detectors() -> None:
    """List the detector registry: code, name, what each needs, every default (its typed fields)."""
    from forensics.detectors import DETECTORS

    for d in DETECTORS:
        defaults = d.defaults()
        shown = ", ".join(f"{k}={v!r}" for k, v in defaults.items()) if defaults else "none (no thresholds)"
        click.echo(f"{d.code:6} {d.name:32} requires: {d.requirement()}  defaults: {shown}")


@main.command()
@click.argument("root")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Output folder.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Parallel processes.")
@click.option("--scheduler", default=None, help="Address of an existing Dask scheduler (tcp://HOST:PORT).")
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="A previous summary.json: findings become new / known / resolved.")
@click.option("--fail-on-new", is_flag=True, help="Exit 1 only for anomalies not in the baseline.")
@click.option("--no-cache", is_flag=True, help="Re-analyse every run (ignore OUT/.cache).")
@click.option("--run-timeout", type=click.FloatRange(min=0, min_open=True), default=900.0, show_default=True,
              help="Seconds one run may take; past it the run becomes an error row.")
@click.option("--run-memory", default="8GiB", show_default=True,
              help="Memory one run may hold (e.g. 4GiB); past it the run becomes an error row.")
@click.option("--follow-symlinks", is_flag=True, help="Follow symlinks that lead out of a run folder.")
def audit(root: str, output: Path, jobs: int, scheduler: str | None, baseline: Path | None, fail_on_new: bool,
          no_cache: bool, run_timeout: float, run_memory: str, follow_symlinks: bool) -> None:
    """Audit every run folder under ROOT (a folder or an fsspec URL): reports, index, summary."""
    from forensics.audit import audit as run_audit
    from forensics.run_limits import parse_bytes

    try:
        memory = parse_bytes(run_memory)
    except ValueError:
        raise click.BadParameter(f"not a size: {run_memory!r}", param_hint="--run-memory") from None
    before = os.environ.get("FORENSICS_FOLLOW_SYMLINKS")
    if follow_symlinks:
        os.environ["FORENSICS_FOLLOW_SYMLINKS"] = "1"  # inherited by the worker processes
    try:
        with _errors(root):
            res = run_audit(root, output, jobs=jobs, scheduler=scheduler, baseline=baseline,
                            use_cache=not no_cache, progress=True, run_timeout=run_timeout, run_memory=memory)
    finally:
        if follow_symlinks and before is None:
            os.environ.pop("FORENSICS_FOLLOW_SYMLINKS", None)
    from forensics.model import Verdict

    bad = sum(r["verdict"] == Verdict.ANOMALY for r in res.rows)
    new = sum(r["verdict"] == Verdict.ANOMALY and r["status"] == "new" for r in res.rows)
    click.echo(f"{len(res.rows)} runs ({res.analysed} analysed, {res.cached} cached), {bad} anomalies "
               f"({new} new), {len(res.errors)} unreadable, {res.seconds:.1f} s -> {res.index}", err=True)
    sys.exit(res.exit_code(fail_on_new=fail_on_new))


@main.command()
@click.argument("proxy", type=click.Path(path_type=Path))
@click.argument("target", type=click.Path(path_type=Path))
@click.option("-f", "--format", "fmt", type=click.Choice(_FORMATS), default="html", show_default=True,
              help="Report format.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Where to write the report (default: stdout; for html ./forensics-compare.html).")
@click.option("--summary", is_flag=True, help="Also print the summary on stderr when the payload goes to stdout.")
def compare(proxy: Path, target: Path, fmt: str, output: Path | None, summary: bool) -> None:
    """What changed between a PROXY run and its TARGET, where they parted, and the trial to test it."""
    fmt, output = _format_and_output(fmt, output)
    with _errors(proxy, as_json=fmt == "json"):
        from forensics.compare import compare as run_compare
        from reports.compare_report import render as render_compare

        runs = (None, None)
        if fmt == "html":  # the report's charts draw the two runs' series: the renderer reads nothing itself
            from forensics.api import load

            runs = (load(proxy), load(target))  # read once: compare works on the same two runs
            output = output or Path("forensics-compare.html")
        result = run_compare(proxy, target, loaded=runs if runs[0] is not None else None)
        _emit(render_compare(result, fmt, *runs), output)
        if output is not None or summary:  # stdout is not the payload, or asked for
            dep, top = result["departure"], (result["explanations"] or [None])[0]
            where = f"{dep['signal']} at step {dep['step']}" if dep else "none"
            what = (top["setting"] or top["mechanism"]) if top else "none"
            click.echo(f"departure: {where}; top explanation: {what}", err=True)


@main.command()
@click.argument("root", type=click.Path(path_type=Path))
@click.option("-f", "--format", "fmt", type=click.Choice(_FORMATS), default="html", show_default=True,
              help="Report format.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Where to write the report (default: stdout; for html ./forensics-sweep.html).")
@click.option("--target-width", "--target-d-model", "target_width", type=click.IntRange(min=1), default=None,
              help="Width (d_model) to extrapolate the size trends and the largest stable lr to.")
@click.option("--target-params", type=click.FloatRange(min=1), default=None,
              help="Parameter count to extrapolate to (e.g. 7e10; converted to width or depth).")
@click.option("--summary", is_flag=True, help="Also print the summary on stderr when the payload goes to stdout.")
def sweep(root: Path, fmt: str, output: Path | None, target_width: int | None, target_params: float | None,
          summary: bool) -> None:
    """LR sweep under ROOT: final loss vs lr, LR sensitivity, largest stable lr, size trends."""
    fmt, output = _format_and_output(fmt, output)
    with _errors(root, as_json=fmt == "json"):
        from forensics.sweep import sweep as run_sweep
        from reports.sweep_report import render as render_sweep

        result = run_sweep(root, target_width=target_width, target_params=target_params)
        if fmt == "html" and output is None:
            output = Path("forensics-sweep.html")
        _emit(render_sweep(result, fmt), output)
        for g in (result["groups"] if output is not None or summary else ()):
            key = ", ".join(f"{k}={v}" for k, v in g["key"].items()) or "all runs"
            click.echo(f"{key}: LR sensitivity {g['lr_sensitivity']:.3f}, largest stable lr "
                       f"{g['largest_stable_lr']}, best lr {g['best_lr']}", err=True)
        for p in result.get("size_predictions", []):
            if p.get("predicted_largest_stable_lr") is not None:
                click.echo(f"predicted largest stable lr at {p['size_key']} {p['target_size']:g}: "
                           f"{p['predicted_largest_stable_lr']} (range {p['interval']}, {p['method']})", err=True)


main.add_command(serve)
main.add_command(watch)

if __name__ == "__main__":
    main()
