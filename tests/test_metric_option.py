"""The --metric option: unknown canonical names are refused, a column no input holds is warned about."""

from __future__ import annotations

import json

from click.testing import CliRunner

from forensics.cli import main


def test_metric_option_refuses_unknown_names_and_warns_on_missing_columns(tmp_path):
    """--metric bogus=COL is a usage error naming the canonical metrics; a column no input holds is warned about."""
    with (tmp_path / "metrics.jsonl").open("w") as f:
        for i in range(60):
            f.write(json.dumps({"step": i, "train/loss": 3 - i / 100, "lr": 1e-3}) + "\n")
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json", "--metric", "bogus=train/loss"])
    assert r.exit_code == 2 and "not a canonical metric" in json.loads(r.stdout)["error"]["message"]
    r = CliRunner().invoke(main, ["analyze", str(tmp_path), "-f", "json", "--metric", "loss=does/not/exist"])
    assert r.exit_code in (0, 1) and "no series named 'does/not/exist'" in r.stderr
    assert json.loads(r.stdout)["verdict"] == "healthy"  # the mapping is ignored, train/loss is still the loss
