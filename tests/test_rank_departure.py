"""RK01 (one bad rank) on REAL data-parallel runs: torch.distributed (gloo, CPU) jobs trained here.

``sample_logs/make_rank_runs.py`` trains every scenario in one launch of four processes (one per rank, each with its
own data shard, gradients all-reduced every step): a rank that reads a corrupted shard, a rank whose weights take a
bit flip, a rank whose loss is NaN, all ranks diverging at a too-high lr, and healthy jobs; as per-rank JSONL files
and as interleaved rank-prefixed stdout (``[rank3]:``, ``3: ``). The analysis must name the bad rank and
``hardware_or_distributed`` / ``bad_rank`` (not "lr too high"), and never find a bad rank in the negatives.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.api import analyze, load
from forensics.detectors.rank_departure import RankDeparture
from forensics.model import RunData

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sample_logs"))
import make_rank_runs as mk  # noqa: E402 - the generator lives beside the other sample makers

SEED = 3
"""Not the seed the thresholds were looked at with (0): the tests judge runs the rules were not tuned on."""
ONSET_TOL = 3
"""Logged steps the onset may be off from the injected fault step (the trailing median crosses late, walked back)."""


def _set() -> list[mk.Scenario]:
    return [
        mk.Scenario("shard4", "shard", 2, 170, 4, steps=260, seed=SEED),
        mk.Scenario("sdc4", "sdc", 1, 140, 4, steps=260, seed=SEED),
        mk.Scenario("nan4", "nan", 3, 210, 4, steps=260, seed=SEED),
        mk.Scenario("lr4", "lr", 0, 140, 4, steps=260, seed=SEED),
        mk.Scenario("healthy4", "healthy", 0, 0, 4, steps=260, seed=SEED),
        mk.Scenario("shard2", "shard", 0, 150, 2, steps=260, seed=SEED),
        mk.Scenario("healthy2", "healthy", 0, 0, 2, steps=260, seed=SEED),
        mk.Scenario("titan_shard4", "shard", 1, 190, 4, steps=260, seed=SEED, style="bracket"),
        mk.Scenario("label_nan4", "nan", 2, 160, 4, steps=260, seed=SEED, style="label"),
        mk.Scenario("label_healthy4", "healthy", 0, 0, 4, steps=260, seed=SEED, style="label"),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[mk.Scenario, Path]]:
    """Every scenario trained for real (one launch of four gloo processes, a few seconds on an idle machine)."""
    out = tmp_path_factory.mktemp("rank_runs")
    return {s.name: (s, out / s.name) for s in mk.make(out, _set())}


def _rk(run: RunData) -> list:
    return RankDeparture().detect(run)


@pytest.mark.parametrize("name", ["shard4", "sdc4", "nan4", "shard2", "titan_shard4", "label_nan4"])
def test_one_bad_rank_is_named_with_its_onset(runs, name):
    """The bad rank, the agreeing ranks and the onset (the fault step) are named; the cause is one bad rank."""
    sc, path = runs[name]
    a = analyze(path)
    assert (a.cause, a.mechanism) == ("hardware_or_distributed", "bad_rank"), (a.cause, a.mechanism, a.hypotheses)
    rk = [f for f in a.findings if f.code == "RK01"]
    assert [f.evidence["rank"] for f in rk] == [sc.bad_rank]
    ev = rk[0].evidence
    assert sorted(ev["agreeing_ranks"]) == [r for r in range(sc.world) if r != sc.bad_rank]
    assert abs(rk[0].step - sc.fault_step) <= ONSET_TOL, (rk[0].step, sc.fault_step)
    assert abs(a.onset["step"] - sc.fault_step) <= ONSET_TOL, (a.onset, sc.fault_step)
    assert f"rank {sc.bad_rank}" in rk[0].message
    if sc.fault == "nan":
        assert ev["nonfinite"] and rk[0].step == sc.fault_step
    assert rk[0].confidence == (RankDeparture.two_ranks_confidence if sc.world == 2 else RankDeparture.confidence)
    # the growth/lr reading of the run-level series is demoted: the other ranks at the same lr are healthy
    for h in a.hypotheses:
        if h.cause == "update_scale_growth":
            assert h.confidence < 0.5 and any("same lr" in x for x in h.against)


def test_the_plan_excludes_the_rank_and_replays_its_shard(runs):
    """The trial excludes that rank's node and replays its shard, before the onset, judged across ranks."""
    sc, path = runs["shard4"]
    a = analyze(path)
    plan = a.recovery
    names = [t.name for t in plan.trials]
    assert names[:2] == ["exclude the rank's node", "replay the rank's shard"]
    assert plan.trials[0].settings["exclude_rank"] == sc.bad_rank
    assert plan.trials[1].settings["replay_rank_shard"] == sc.bad_rank
    assert "RK01" in plan.success_criteria[0]
    assert any("lower the lr" in d for d in plan.do_not)
    assert not any("lr x" in n for n in names)
    assert plan.resume_from["step"] < a.onset["step"]


def test_ranks_that_diverge_together_are_not_a_bad_rank(runs):
    """A true lr problem (every rank at an lr ramped 300x): every rank departs, none alone."""
    _, path = runs["lr4"]
    run = load(path)
    assert run.ranks.get_column("rank").n_unique() == 4
    assert _rk(run) == []
    a = analyze(path)
    assert a.verdict == "anomaly" and a.cause != "hardware_or_distributed"


@pytest.mark.parametrize("name", ["healthy4", "healthy2", "label_healthy4"])
def test_healthy_ranks_with_their_own_shards_stay_healthy(runs, name):
    """Ranks that differ only by their own shards' noise: no bad rank, a healthy verdict."""
    _, path = runs[name]
    run = load(path)
    assert run.ranks.get_column("rank").n_unique() == runs[name][0].world
    assert _rk(run) == []
    a = analyze(path)
    assert a.verdict == "healthy", (a.verdict, a.cause, [f.code for f in a.findings])


def test_rank_prefixed_lines_keep_every_ranks_values(runs):
    """``[rank1]:`` and ``3: `` lines: the run's rows keep one value per step, ``RunData.ranks`` every rank's."""
    for name in ("titan_shard4", "label_healthy4"):
        sc, path = runs[name]
        run = load(path)
        per = run.ranks.group_by("rank", "metric").len()
        assert per.height == 2 * sc.world and set(per.get_column("len").to_list()) == {sc.steps}
        assert len(run.series("loss")) == sc.steps


def test_per_rank_files_keep_every_ranks_values_as_logged(runs):
    """``RunData.ranks`` holds a rank's own values from its file, NaN as logged."""
    sc, path = runs["nan4"]
    run = load(path)
    own = run.ranks.filter((pl.col("rank") == sc.bad_rank) & (pl.col("metric") == "loss")).sort("step")
    lines = [json.loads(x) for x in (path / f"metrics_rank{sc.bad_rank}.jsonl").read_text().splitlines()]
    assert own.get_column("step").to_list() == [r["step"] for r in lines]
    np.testing.assert_array_equal(own.get_column("value").to_numpy(), np.array([r["loss"] for r in lines]))


def test_one_rank_alone_is_not_compared(tmp_path):
    """A single rank's file: nothing to compare, RK01 is skipped with its reason."""
    (tmp_path / "metrics_rank0.jsonl").write_text(
        "".join(json.dumps({"step": s, "rank": 0, "loss": 2.0 - s / 400}) + "\n" for s in range(200)))
    a = analyze(tmp_path)
    assert not [f for f in a.findings if f.code == "RK01"]
    assert any(s.what.startswith("RK01") for s in a.skipped)


def _rank_files(folder: Path, n_ranks: int, steps: int, loss, gnorm) -> Path:  # noqa: ANN001 - callables
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(n_ranks):
        rows = [{"step": s, "rank": r, "loss": loss(r, s), "grad_norm": gnorm(r, s)} for s in range(steps)]
        (folder / f"metrics_rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return folder


def test_a_grad_norm_alone_names_no_rank(tmp_path):
    """One rank's grad norm drifts x3 (a partition's norm) or is inf once (an fp16 overflow) while every loss agrees."""
    rng = np.random.default_rng(11)
    noise = rng.normal(0, 0.02, (4, 400))

    def loss(r, s):
        return float(2.5 * np.exp(-s / 300) + 0.5 + noise[r, s])

    def drift(r, s):
        return float(1.0 + (2.0 * max(0, s - 200) / 200 if r == 1 else 0.0) + noise[r, s])

    def overflow(r, s):
        return float("inf") if (r == 2 and s == 250) else float(1.0 + noise[r, s])

    for name, g in (("drift", drift), ("overflow", overflow)):
        run = load(_rank_files(tmp_path / name, 4, 400, loss, g))
        assert run.ranks.get_column("rank").n_unique() == 4
        assert _rk(run) == [], name
