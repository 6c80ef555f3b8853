"""The tool's own reports and ingest tables kept in a run folder are not read back as training logs."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from forensics.api import analyze_run, load
from forensics.cli import main


def test_reports_and_tables_in_the_run_folder_change_nothing(tmp_path: Path) -> None:
    """Reports (text, Markdown, JSON) and an ingest folder beside the logs change neither rows nor verdict.

    Same rows, verdict and confidence as the clean folder; each is listed as our own output.
    """
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").write_text("".join(
        f"step {s} loss {3 - s * 0.005 + (4.0 if 120 <= s < 123 else 0.0):.4f} lr 0.001\n" for s in range(300)))
    clean = load(run)
    before = analyze_run(clean)
    runner = CliRunner()
    for fmt, name in (("text", "forensics.txt"), ("markdown", "report.md"), ("json", "report.json")):
        assert runner.invoke(main, ["analyze", str(run), "-f", fmt, "-o", str(run / name),
                                    "--fail-on", "never"]).exit_code == 0
    assert runner.invoke(main, ["ingest", str(run), "-o", str(run / "tables")]).exit_code == 0
    again = load(run)
    assert again.metrics.height == clean.metrics.height and again.n_segments == clean.n_segments
    after = analyze_run(again)
    assert (after.verdict, after.cause, after.confidence) == (before.verdict, before.cause, before.confidence)
    own = {s.what for s in again.skipped if "train-forensics output" in s.reason}
    assert {"forensics.txt", "report.md", "tables/metrics.parquet"} <= own
