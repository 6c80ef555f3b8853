"""``forensics audit``: discovery, parallel = serial, error rows, cache, baseline, index, Dask and S3."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics import audit as audit_mod
from forensics import audit_execute
from forensics.audit import COLUMNS, audit, find_runs
from forensics.cli import main

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
CASES = Path(__file__).resolve().parents[2] / "shared" / "cases"
VOLATILE = ("path", "cached", "seconds")
"""Row fields that legitimately differ between two audits of the same runs."""


def _sample_runs() -> list[Path]:
    """Finished sample runs (their ``expected.json`` is written last), plus cases when no anomaly is among them."""
    runs = sorted(d for d in SAMPLES.glob("*/") if (d / "expected.json").is_file()) if SAMPLES.is_dir() else []
    verdicts = {json.loads((d / "expected.json").read_text()).get("verdict") for d in runs}
    if "anomaly" not in verdicts and CASES.is_dir():
        runs += [CASES / n for n in ("br03_multisteplr_resume", "br08_t5_fp16_ff_overflow") if (CASES / n).is_dir()]
    if len(runs) < 2:
        pytest.skip("neither finished sample runs nor acceptance cases are available")
    return runs


def _copy(runs: list[Path], root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for d in runs:
        shutil.copytree(d, root / d.name)
    return root


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temp copy of the sample runs (or a few cases)."""
    return _copy(_sample_runs(), tmp_path_factory.mktemp("audit") / "root")


@pytest.fixture(scope="module")
def local_audit(root: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The reference audit: jobs=1, JSON reports only (fast)."""
    return audit(root, tmp_path_factory.mktemp("out1"), jobs=1, formats=("json",), progress=False)


def _touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_find_runs_layouts(tmp_path: Path) -> None:
    """Nested projects, Lightning versions, HF checkpoints, W&B runs and case folders: one run per experiment."""
    line = '{"step": 1, "loss": 2.0}\n'
    _touch(tmp_path / "projA/run1/metrics.jsonl", line)
    _touch(tmp_path / "projA/run2/metrics.jsonl", line)
    _touch(tmp_path / "exp/lightning_logs/version_0/events.out.tfevents.1.h.0")
    _touch(tmp_path / "exp/lightning_logs/version_1/events.out.tfevents.2.h.0")
    _touch(tmp_path / "hf/output/checkpoint-10/trainer_state.json", "{}")
    _touch(tmp_path / "hf/output/checkpoint-20/trainer_state.json", "{}")
    _touch(tmp_path / "case/expected.json", "{}")
    _touch(tmp_path / "case/out_a/train.log", "step 1 loss 2\n")
    _touch(tmp_path / "case/out_b/train.log", "step 1 loss 2\n")
    _touch(tmp_path / "wb/wandb/run-20240101_000000-aaa/files/output.log", "x\n")
    _touch(tmp_path / "wb/wandb/run-20240102_000000-bbb/files/output.log", "x\n")
    _touch(tmp_path / "single/notes.md", "notes\n")
    _touch(tmp_path / "single/wandb/offline-run-20240101_000000-ccc/files/output.log", "x\n")
    _touch(tmp_path / "nologs/README.md", "nothing\n")
    _touch(tmp_path / ".hidden/metrics.jsonl", line)
    got = [Path(p).relative_to(tmp_path).as_posix() for p in find_runs(tmp_path)]
    assert got == ["case", "exp", "hf", "projA/run1", "projA/run2", "single",
                   "wb/wandb/run-20240101_000000-aaa", "wb/wandb/run-20240102_000000-bbb"]
    assert find_runs(tmp_path / "exp") == [str(tmp_path / "exp")]  # ROOT that is itself one run
    assert [Path(p).name for p in find_runs(tmp_path / "wb/wandb")] == ["run-20240101_000000-aaa",
                                                                        "run-20240102_000000-bbb"]
    assert find_runs(tmp_path / "projA/run1") == [str(tmp_path / "projA/run1")]


def test_a_launch_script_beside_the_runs_does_not_merge_them(tmp_path: Path) -> None:
    """``exp/train.py`` (or a notebook, a launch script) beside ``exp/seed_1/``... : each seed is a run (U13)."""
    line = '{"step": 1, "loss": 2.0}\n'
    for seed in (1, 2, 3):
        _touch(tmp_path / f"exp/seed_{seed}/metrics.jsonl", line)
    for name in ("train.py", "launch.sh", "sweep.ipynb", "requirements.txt", "pyproject.toml"):
        _touch(tmp_path / "exp" / name, "x\n")
    _touch(tmp_path / "one/train.py", "x\n")  # a run folder with its script and its logs folder: still one run
    _touch(tmp_path / "one/logs/metrics.jsonl", line)
    got = [Path(p).relative_to(tmp_path).as_posix() for p in find_runs(tmp_path)]
    assert got == ["exp/seed_1", "exp/seed_2", "exp/seed_3", "one"]
    _touch(tmp_path / "exp/config.yaml", "lr: 1\n")  # a configuration of its own: the folder is one run again
    assert "exp" in [Path(p).relative_to(tmp_path).as_posix() for p in find_runs(tmp_path)]


@pytest.mark.parametrize("folder", [SAMPLES, CASES], ids=["sample_logs", "cases"])
def test_find_runs_one_per_sample_and_case(folder: Path) -> None:
    """One run per case and per sample run; a folder of several runs (an lr sweep) gives each of its runs."""
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    runs = [Path(p) for p in find_runs(folder)]
    tops = [d for d in sorted(folder.iterdir()) if d.is_dir() and not d.name.startswith((".", "__"))
            and any(f.is_file() for f in d.rglob("*"))]
    for top in tops:
        inside = [r for r in runs if r == top or top in r.parents]
        if (top / "expected.json").is_file():  # a case or a finished sample run: exactly one row
            assert inside == [top], (top, inside)
        else:
            assert inside and all(top in r.parents for r in inside), (top, inside)
    assert len(runs) == sum(1 for r in runs for t in tops if r == t or t in r.parents)
    sweep = folder / "sweep"
    if sweep.is_dir():
        members = sorted(d for d in sweep.iterdir() if d.is_dir() and any(d.glob("*.jsonl")))
        assert [r for r in runs if sweep in r.parents] == members


def test_jobs_1_and_2_give_the_same_rows(root: Path, local_audit, tmp_path: Path) -> None:  # noqa: ANN001
    """Two worker processes give exactly the rows of the serial audit, one per run."""
    par = audit(root, tmp_path / "out2", jobs=2, formats=("json",), progress=False)
    assert [r["run"] for r in local_audit.rows] == sorted(d.name for d in root.iterdir())
    assert _stable(par.rows) == _stable(local_audit.rows)
    assert all(r["error"] is None and r["verdict"] for r in par.rows)
    for r in par.rows:
        report = json.loads((tmp_path / "out2" / r["report"]).read_text())
        assert report["verdict"] == r["verdict"] and report["cause"] == r["cause"]


def test_broken_runs_become_error_rows(tmp_path: Path) -> None:
    """An empty event file and a garbage .jsonl are rows with an error; the audit finishes."""
    good = _sample_runs()[0]
    root = _copy([good], tmp_path / "root")
    _touch(root / "empty_events/events.out.tfevents.1700000000.host.0")
    (root / "garbage").mkdir()
    (root / "garbage/metrics.jsonl").write_bytes(b"\x00\x01garbage{{{\nnot json at all\n")
    res = audit(root, tmp_path / "out", jobs=2, formats=("json",), progress=False)
    by = {r["run"]: r for r in res.rows}
    assert set(by) == {good.name, "empty_events", "garbage"}
    assert by[good.name]["error"] is None
    for bad in ("empty_events", "garbage"):
        assert by[bad]["error"] and by[bad]["verdict"] is None and by[bad]["report"] is None
    assert "empty event file" in by["empty_events"]["error"]
    assert "index.html" in os.listdir(tmp_path / "out")
    again = audit(root, tmp_path / "out", formats=("json",), progress=False)  # read errors are cached too
    assert again.analysed == 0 and _stable(again.rows) == _stable(res.rows)


def test_second_audit_is_served_from_the_cache(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unchanged runs are not analysed again; a changed run is."""
    out = tmp_path / "out"
    first = audit(root, out, formats=("json",), progress=False)
    calls: list[str] = []
    real = audit_execute.work

    def counting(task):  # noqa: ANN001, ANN202
        calls.append(task.run)
        return real(task)

    monkeypatch.setattr(audit_execute, "work", counting)
    second = audit(root, out, formats=("json",), progress=False)
    assert calls == [] and second.analysed == 0 and second.cached == len(first.rows)
    assert all(r["cached"] for r in second.rows) and _stable(second.rows) == _stable(first.rows)
    assert all((out / r["report"]).is_file() for r in second.rows)
    changed = sorted(root.iterdir())[0]
    victim = next(p for p in sorted(changed.rglob("*")) if p.is_file())
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    third = audit(root, out, formats=("json",), progress=False)
    assert calls == [changed.name] and third.analysed == 1
    audit(root, out, formats=("json",), progress=False, use_cache=False)
    assert len(calls) == 1 + len(first.rows)


def test_baseline_new_known_resolved(root: Path, local_audit, tmp_path: Path) -> None:  # noqa: ANN001
    """Same fingerprint -> known; different -> new; a baseline finding on a now healthy run -> resolved."""
    rows = local_audit.rows
    found = [r for r in rows if r["fingerprint"]]
    healthy = [r for r in rows if r["verdict"] == "healthy"]
    assert found, "the fixture needs at least one run with a finding"
    base = {r["run"]: r["fingerprint"] for r in rows}
    base[found[0]["run"]] = found[0]["fingerprint"]  # known
    for r in found[1:]:
        base[r["run"]] = "overflow/other/@99999"  # new
    for r in healthy:
        base[r["run"]] = "data_batch/bad_batch/@10"  # resolved
    path = tmp_path / "previous.json"
    path.write_text(json.dumps({"rows": [{"run": k, "fingerprint": v} for k, v in base.items()]}))
    res = audit(root, local_audit.out_dir, formats=("json",), progress=False, baseline=path)
    status = {r["run"]: r["status"] for r in res.rows}
    assert status[found[0]["run"]] == "known"
    assert all(status[r["run"]] == "new" for r in found[1:])
    assert all(status[r["run"]] == "resolved" for r in healthy)
    fail_new = res.exit_code(fail_on_new=True)
    assert fail_new == (1 if any(r["verdict"] == "anomaly" for r in found[1:]) else 0)
    assert res.exit_code() == (1 if any(r["verdict"] == "anomaly" for r in rows) else 0)


def test_index_html_and_summary(root: Path, tmp_path: Path) -> None:
    """The index has one row and one working link per run; summary.parquet/.json have the documented columns."""
    import pyarrow.parquet as pq

    runs = sorted(root.iterdir())[:2]
    small = _copy(runs, tmp_path / "root")
    weird = small / "a&b <i>"
    shutil.copytree(runs[0], weird)
    out = tmp_path / "out"
    res = audit(small, out, jobs=2, progress=False)
    html = (out / "index.html").read_text()
    assert html.count('<tr id="run-') == len(res.rows) == 3
    assert "a&amp;b &lt;i&gt;" in html and "a&b <i>" not in html
    for r in res.rows:
        assert f'href="{r["report"]}"' in html and r["report"].endswith("report.html")
        assert (out / r["report"]).is_file() and (out / r["report"]).with_suffix(".json").is_file()
    assert "<script src" not in html and "<link" not in html  # self-contained
    table = pq.read_table(out / "summary.parquet")
    assert table.column_names == list(COLUMNS) and table.num_rows == 3
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in summary["rows"]] == [r["run"] for r in res.rows]
    assert set(summary["rows"][0]) == set(COLUMNS)


def test_cohort_robust_z(tmp_path: Path) -> None:
    """Copies of one configuration form a cohort; z is 0 for identical copies."""
    run = _sample_runs()[0]
    root = _copy([run], tmp_path / "root")
    for i in range(3):
        shutil.copytree(run, root / f"copy{i}")
    res = audit(root, tmp_path / "out", formats=("json",), progress=False)
    assert len({r["cohort"] for r in res.rows}) == 1
    assert all(r["spikes_z"] == 0.0 for r in res.rows)
    assert audit_mod.robust_z([10, 11, 12, 500])[-1] > 3.5
    assert audit_mod.robust_z([1.0, 2.0]) == [None, None]


def test_cli_exit_codes(root: Path, local_audit, tmp_path: Path) -> None:  # noqa: ANN001
    """0/1 by anomaly (or new anomaly), 2 with one line for a missing ROOT or baseline."""
    res = CliRunner().invoke(main, ["audit", str(tmp_path / "missing"), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    runs = sorted(root.iterdir())[:2]
    small = _copy(runs, tmp_path / "root")
    res = CliRunner().invoke(main, ["audit", str(small), "-o", str(tmp_path / "o"), "--jobs", "2"])
    anomaly = any(r["verdict"] == "anomaly" for r in local_audit.rows if r["run"] in {d.name for d in runs})
    assert res.exit_code == (1 if anomaly else 0), res.output
    assert "2 runs (2 analysed, 0 cached)" in res.stderr
    summary = tmp_path / "o" / "summary.json"
    res = CliRunner().invoke(main, ["audit", str(small), "-o", str(tmp_path / "o"), "--baseline", str(summary),
                                    "--fail-on-new"])
    assert res.exit_code == 0 and "2 runs (0 analysed, 2 cached)" in res.stderr, res.output
    res = CliRunner().invoke(main, ["audit", str(small), "-o", str(tmp_path / "o"), "--baseline",
                                    str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, root: Path):  # noqa: ANN201
    """A moto S3 server on loopback with two runs uploaded under ``s3://forensics-test/runs``."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "FSSPEC_S3_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="forensics-test")
    runs = sorted(root.iterdir())[:2]
    for d in runs:
        for f in d.rglob("*"):
            if f.is_file():
                client.upload_file(str(f), "forensics-test", f"runs/{d.name}/{f.relative_to(d).as_posix()}")
    yield runs
    server.stop()


@pytest.mark.slow
def test_s3_root_gives_the_local_rows(s3: list[Path], local_audit, tmp_path: Path) -> None:  # noqa: ANN001
    """``s3://bucket/runs`` (moto on loopback) gives the rows of the local audit; the second audit is cached."""
    res = audit("s3://forensics-test/runs", tmp_path / "out", jobs=2, formats=("json",), progress=False)
    names = [d.name for d in s3]
    assert [r["run"] for r in res.rows] == names
    assert res.rows[0]["path"] == f"s3://forensics-test/runs/{names[0]}"
    local = [r for r in local_audit.rows if r["run"] in names]
    assert _stable(res.rows) == _stable(local)
    again = audit("s3://forensics-test/runs", tmp_path / "out", formats=("json",), progress=False)
    assert again.analysed == 0 and _stable(again.rows) == _stable(local)


@pytest.mark.slow
def test_dask_cluster_over_s3_gives_the_local_rows(s3: list[Path], local_audit, root: Path,  # noqa: ANN001
                                                    tmp_path: Path) -> None:
    """A local Dask cluster (2 worker processes, loopback) gives the local rows, from a folder and from S3."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address="127.0.0.1:0") as cluster:
        res = audit(root, tmp_path / "out", scheduler=cluster.scheduler_address, formats=("json",), progress=False)
        assert _stable(res.rows) == _stable(local_audit.rows)
        remote = audit("s3://forensics-test/runs", tmp_path / "out_s3", scheduler=cluster.scheduler_address,
                       formats=("json",), progress=False)
    names = [d.name for d in s3]
    assert _stable(remote.rows) == _stable([r for r in local_audit.rows if r["run"] in names])


def test_cli_audit_passes_the_run_limits(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``forensics audit`` always analyses under per-run limits (the API's default is none).

    900 s and 8 GiB unless told otherwise; ``--run-timeout``/``--run-memory`` set them; a malformed size is a
    usage error.
    """
    seen: list[dict] = []

    def recording(root_arg, out_dir, **kwargs):  # noqa: ANN001, ANN202
        seen.append(kwargs)
        return audit_mod.AuditResult(root=str(root_arg), out_dir=Path(out_dir))

    monkeypatch.setattr(audit_mod, "audit", recording)
    assert CliRunner().invoke(main, ["audit", str(root), "-o", str(tmp_path / "a")]).exit_code == 0
    assert CliRunner().invoke(main, ["audit", str(root), "-o", str(tmp_path / "b"), "--run-timeout", "5",
                                     "--run-memory", "512MiB"]).exit_code == 0
    assert [(k["run_timeout"], k["run_memory"]) for k in seen] == [(900.0, 8 << 30), (5.0, 512 << 20)]
    bad = CliRunner().invoke(main, ["audit", str(root), "-o", str(tmp_path / "c"), "--run-memory", "lots"])
    assert bad.exit_code == 2 and "not a size" in bad.output


def test_cli_audit_run_over_its_memory_budget_is_an_error_row(root: Path, tmp_path: Path) -> None:
    """A run whose analysis holds more than ``--run-memory`` is stopped: an error row, the audit completes."""
    from forensics.run_limits import rss_bytes

    if rss_bytes(os.getpid()) is None:
        pytest.skip("no /proc/<pid>/statm: resident memory is not sampled here")
    small = _copy(sorted(root.iterdir())[:2], tmp_path / "small")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["audit", str(small), "-o", str(out), "--no-cache", "--run-memory", "40MiB"])
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "summary.json").read_text(encoding="utf-8"))["rows"]
    assert len(rows) == 2 and all("over budget" in (r["error"] or "") for r in rows), rows
    assert (out / "index.html").stat().st_size > 0


def test_a_deep_sweep_path_gets_a_short_name_and_every_run_a_row(tmp_path: Path) -> None:
    """A ~250-character, 3-level hparam-style run path does not kill the audit with "File name too long".

    Its outputs get a shortened name plus a hash, and the short run beside it a row too.
    """
    root = tmp_path / "root"
    deep = root / "sweep_transformer_d512_L12_H8" / ("lr=3e-4,wd=0.1,warmup=2000,beta2=0.95,clip=1.0,batch=512,"
                                                    "seq=2048,dropout=0.0,init=small,norm=rmsnorm") / (
        "seed=0,data=fineweb-edu-10BT-shuffled-v2,tokenizer=gpt2,eval_every=500,ckpt_every=1000,precision=bf16")
    for run in (deep, root / "short_run"):
        run.mkdir(parents=True)
        (run / "train.log").write_text("".join(f"step {s} loss {3 - s * 0.01:.4f} lr 0.001\n" for s in range(60)))
    result = audit(root, tmp_path / "out", jobs=1, progress=False)
    assert len(result.rows) == 2 and all(r["error"] is None for r in result.rows)
    assert all(len(p.name) <= 255 for p in (tmp_path / "out").rglob("*"))


def test_a_folder_no_parser_reads_gets_an_error_row(tmp_path: Path) -> None:
    """A run whose only log no parser recognises is listed with an error row, not left out without a word.

    (A NUL-filled log, say; a README beside the runs is no run.)
    """
    root = tmp_path / "root"
    good, bad = root / "good", root / "bad"
    good.mkdir(parents=True)
    bad.mkdir()
    (good / "train.log").write_text("".join(f"step {s} loss {3 - s * 0.01:.4f} lr 0.001\n" for s in range(60)))
    (bad / "train.log").write_bytes(b"\x00" * 4096)
    (root / "README.txt").write_text("sweep of 2 runs\n")
    result = audit(root, tmp_path / "out", jobs=1, progress=False)
    rows = {r["run"]: r for r in result.rows}
    assert set(rows) == {"good", "bad"}
    assert rows["good"]["error"] is None and rows["bad"]["error"]
