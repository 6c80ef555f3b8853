"""Lead time: how many steps before the failure does the live service alert, and does it alert on healthy runs?

Every labelled run (``sample_logs/<fault>/`` with its ``expected.json`` and the corpus
``sample_logs/corpus/`` with ``corpus_labels.json``) is replayed step by step, as its writers wrote it
(:mod:`forensics.service.replay`: JSONL and text lines, TensorBoard frames, checkpoints at their step).

Two modes:

- ``--mode service`` (default): a real ``forensics serve`` watches a temporary root; ``--concurrent``
  runs at a time are written into it at ``--rate`` steps per second each; the alert step of a run is
  the last step the service had read when it opened the run's first incident (``seen_step``).
- ``--mode stepwise``: no server and no clock; the run is analysed after every ``--every`` steps with
  the same incremental reader and the same alert confirmation (:class:`forensics.service.incidents.Confirmer`)
  as the service (the last step counts as the run's end: its alerts are final). This gives the
  analyser's own lead time, independent of machine speed.

Failure step (from the labels): the first non-finite loss (``first_nonfinite_loss``,
``first_skipped_step_and_nan_loss``, ``all_padding_batch_nan_loss``) or the divergence
(``loss_above_healthy_for_good``). Lead = failure step - alert step (positive: the alert came first).
Precursor-type faults: ``update_scale_growth`` and ``overflow`` (overflow after growth).

    python benchmarks/lead_time.py --mode stepwise --every 2
    python benchmarks/lead_time.py --mode service --rate 20 --concurrent 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

FAILURE_KEYS = ("first_nonfinite_loss", "first_skipped_step_and_nan_loss", "all_padding_batch_nan_loss",
                "loss_above_healthy_for_good")
PRECURSOR_CAUSES = ("update_scale_growth", "overflow")


def labelled_runs(samples: Path) -> list[dict[str, Any]]:
    """``[{run, path, verdict, cause, onset_window, failure}]`` for the sample runs and the corpus."""
    out = []
    for d in sorted(samples.iterdir()):
        exp = d / "expected.json"
        if d.is_dir() and exp.is_file() and not (d / "ckpt").exists():
            lab = json.loads(exp.read_text())
            out.append({"run": d.name, "path": d, **_label(lab)})
    labels = samples / "corpus_labels.json"
    if labels.is_file():
        for lab in json.loads(labels.read_text()):
            d = samples / "corpus" / lab["run"]
            if d.is_dir():
                out.append({"run": f"corpus/{lab['run']}", "path": d, **_label(lab)})
    return out


def _label(lab: dict[str, Any]) -> dict[str, Any]:
    ev = lab.get("events") or {}
    fail = next((ev[k] for k in FAILURE_KEYS if isinstance(ev.get(k), int)), None)
    return {"verdict": lab["verdict"], "cause": lab.get("cause"), "onset_window": lab.get("onset_window"),
            "failure": fail}


def stepwise_one(item: dict[str, Any], every: int) -> dict[str, Any]:
    """Replay one run in-process and analyse it every ``every`` steps; the first confirmed alert."""
    from forensics.api import analyze_run, load
    from forensics.service.incidents import Confirmer, alerts_of
    from forensics.service.replay import plan, steps_of, write_until
    from parsers.incremental import IncrementalReader
    from reports import render

    src = Path(item["path"])
    pieces = plan(src)
    steps = steps_of(pieces)
    tmp = Path(tempfile.mkdtemp(prefix="lead-"))
    dst = tmp / src.name
    dst.mkdir()
    reader, conf = IncrementalReader(), Confirmer()
    i, first = 0, None
    analyses = 0
    try:
        for k, until in enumerate(steps):
            i = write_until(pieces, src, dst, i, until)
            if until[1] < 1 or (k % every and k != len(steps) - 1):
                continue
            try:
                run = load(dst, reader=reader.read)
            except Exception:  # noqa: BLE001 - nothing readable yet
                continue
            body = json.loads(render(analyze_run(run), None, "json"))
            analyses += 1
            last = int(run.metrics["step"].max())
            got = conf.update(str(dst), alerts_of(body), body, last, final=k == len(steps) - 1)
            if got:
                a = got[0]
                first = {"alert_step": last, "alert_segment": until[0], "alert_kind": a.kind, "alert_cause": a.cause,
                         "alert_onset": a.onset_step}
                break
    finally:
        reader.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {**{k: v for k, v in item.items() if k != "path"}, **(first or {}), "analyses": analyses}


def run_stepwise(items: list[dict[str, Any]], every: int, jobs: int) -> list[dict[str, Any]]:
    """Every run through :func:`stepwise_one`, ``jobs`` at a time."""
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(stepwise_one, items, [every] * len(items)))


def run_service(items: list[dict[str, Any]], rate: float, concurrent: int, workers: int) -> list[dict[str, Any]]:
    """Replay the runs into a root watched by a real ``forensics serve``; alert step = ``seen_step``."""
    from service_helpers import Server, wait_for

    from forensics.service.replay import replay

    base = Path(tempfile.mkdtemp(prefix="lead-service-"))
    root = base / "root"
    root.mkdir()
    settle = 5.0
    srv = Server([root], base / "svc.db", extra=("--workers", str(workers), "--rescan", "2", "--unreadable-grace",
                                                 "60", "--settle", str(settle)))
    names = {it["run"]: it["run"].replace("/", "__") for it in items}
    try:
        pending = list(items)
        active: list[tuple[threading.Thread, dict[str, Any]]] = []
        while pending or active:
            while pending and len(active) < concurrent:
                it = pending.pop(0)
                t = threading.Thread(target=replay, args=(Path(it["path"]), root / names[it["run"]]),
                                     kwargs={"steps_per_tick": 1, "tick_s": 1.0 / rate})
                t.start()
                active.append((t, it))
            time.sleep(0.2)
            active = [(t, it) for t, it in active if t.is_alive()]
        wait_for(lambda: all(r.get("last_analyzed") and r.get("last_step") is not None
                             for r in srv.client.get("/api/runs").json()), timeout=120, what="final analyses")
        time.sleep(settle + 3)  # runs that stopped are final after the settle time
        runs = {r["path"].rpartition("/")[2]: r for r in srv.client.get("/api/runs").json()}
        incidents = srv.client.get("/api/incidents").json()
    finally:
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)
    out = []
    for it in items:
        r = runs.get(names[it["run"]])
        mine = sorted((i for i in incidents if r and i["run_id"] == r["id"]), key=lambda i: i["id"])
        row = {k: v for k, v in it.items() if k != "path"}
        if mine:
            a = mine[0]
            row.update(alert_step=a["seen_step"], alert_kind=a["kind"], alert_cause=a["cause"],
                       alert_onset=a["onset_step"])
        row["analyses"] = None
        out.append(row)
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures: leads, detection, cause match, false alerts on healthy runs."""
    faulty = [r for r in rows if r["verdict"] != "healthy"]
    healthy = [r for r in rows if r["verdict"] == "healthy"]
    for r in faulty:
        r["lead"] = (r["failure"] - r["alert_step"]) if r.get("alert_step") is not None and r["failure"] else None
    pre = [r for r in faulty if r["cause"] in PRECURSOR_CAUSES]
    leads = [r["lead"] for r in pre if r["lead"] is not None]
    out = {
        "faulty_runs": len(faulty), "alerted": sum(r.get("alert_step") is not None for r in faulty),
        "cause_right": sum(r.get("alert_cause") == r["cause"] for r in faulty),
        "precursor_runs": len(pre), "precursor_with_failure": sum(r["failure"] is not None for r in pre),
        "precursor_median_lead_steps": statistics.median(leads) if leads else None,
        "precursor_alert_before_failure": sum(x > 0 for x in leads), "precursor_leads": leads,
        "healthy_runs": len(healthy), "false_alerts_on_healthy": sum(r.get("alert_step") is not None for r in healthy),
    }
    by: dict[str, list[int]] = {}
    for r in faulty:
        if r["lead"] is not None:
            by.setdefault(r["cause"], []).append(r["lead"])
    out["median_lead_by_cause"] = {c: statistics.median(v) for c, v in sorted(by.items())}
    delays = {}
    for r in faulty:
        if r.get("alert_step") is not None and r.get("onset_window"):
            delays.setdefault(r["cause"], []).append(r["alert_step"] - r["onset_window"][1])
    out["median_steps_after_onset_window_end_by_cause"] = {c: statistics.median(v) for c, v in sorted(delays.items())}
    return out


def main() -> None:
    """Command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("service", "stepwise"), default="service")
    ap.add_argument("--every", type=int, default=1, help="stepwise: analyse every N steps")
    ap.add_argument("--jobs", type=int, default=2, help="stepwise: processes")
    ap.add_argument("--rate", type=float, default=20.0, help="service: steps per second per run")
    ap.add_argument("--concurrent", type=int, default=4, help="service: runs replayed at a time")
    ap.add_argument("--workers", type=int, default=2, help="service: analysis processes")
    ap.add_argument("--only", default=None, help="substring of run names to keep")
    ap.add_argument("--json", type=Path, default=None, help="write rows and summary here")
    args = ap.parse_args()
    items = labelled_runs(REPO / "sample_logs")
    if args.only:
        items = [it for it in items if args.only in it["run"]]
    t0 = time.time()
    if args.mode == "stepwise":
        rows = run_stepwise(items, args.every, args.jobs)
    else:
        rows = run_service(items, args.rate, args.concurrent, args.workers)
    summary = summarize(rows)
    print(f"{'run':28} {'label':20} {'onset':>11} {'fail':>5} {'alert@':>6} {'lead':>5}  alert")
    for r in rows:
        win = "-" if not r.get("onset_window") else f"{r['onset_window'][0]}-{r['onset_window'][1]}"
        alert = f"{r.get('alert_kind')} {r.get('alert_cause')} onset {r.get('alert_onset')}" if r.get(
            "alert_step") is not None else "none"
        print(f"{r['run']:28} {str(r['cause']):20} {win:>11} {str(r['failure']):>5} {str(r.get('alert_step')):>6} "
              f"{str(r.get('lead')):>5}  {alert}")
    print(json.dumps({"mode": args.mode, "every": args.every, "rate": args.rate, "seconds": round(time.time() - t0),
                      **summary}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1, default=str))


if __name__ == "__main__":
    main()
