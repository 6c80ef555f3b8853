"""``forensics watch RUN_DIR``: follow one live run in a terminal, alert at the onset.

The loop reads the run incrementally (:class:`parsers.incremental.IncrementalReader`), analyses it
after each change, prints each new alert (:func:`forensics.service.incidents.alerts_of`) once with its
onset and the last step read, posts it to the webhooks, and ends:

- exit 1 as soon as the verdict is ``anomaly`` and its alert is confirmed (``incidents.Confirmer``);
- when the run *ends* (its last step reaches the final step: ``--final-step``, or the run's own
  configuration: ``max_steps``, ``total_steps``, ``train_iters``, ``num_train_steps``, ``steps``; or no
  new record arrived for ``--idle-timeout`` seconds) its alerts are final: exit 1 when the verdict is
  ``anomaly``, else 0;
- exit 2 when the folder never yields a readable record within ``--idle-timeout``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forensics.model import Verdict
from forensics.service import incidents as inc
from forensics.service import webhooks

FINAL_STEP_KEYS = ("max_steps", "total_steps", "train_iters", "num_train_steps", "steps", "total_iters")


def final_step_of(meta: dict[str, Any]) -> int | None:
    """The run's planned last step from its configuration files or hyper-parameters, if stated."""
    dicts: list[dict[str, Any]] = []
    if isinstance(meta.get("hparams"), dict):
        dicts.append(meta["hparams"])
    for cfg in (meta.get("config_files") or {}).values():
        if isinstance(cfg, dict):
            dicts.append(cfg)
            dicts.extend(v for v in cfg.values() if isinstance(v, dict))
    for d in dicts:
        for k in FINAL_STEP_KEYS:
            v = d.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def watch(run_dir: Path, *, interval_s: float = 2.0, idle_timeout_s: float = 300.0, final_step: int | None = None,
          hooks: tuple[str, ...] = (), echo: Callable[[str], None] = print) -> int:
    """Follow ``run_dir`` until it fails or ends (module docstring); returns the exit code."""
    from forensics.api import analyze_run, load
    from forensics.errors import InputError
    from parsers.incremental import IncrementalReader
    from reports import render

    reader = IncrementalReader()
    confirmer = inc.Confirmer()
    seen: set[str] = set()
    last_records, last_change, start = -1, time.monotonic(), time.monotonic()
    body: dict[str, Any] | None = None
    try:
        while True:
            try:
                run = load(run_dir, reader=reader.read)
            except InputError as exc:
                if time.monotonic() - start > idle_timeout_s:
                    echo(f"forensics: error: {exc} (nothing readable after {idle_timeout_s:g} s)")
                    return 2
                time.sleep(interval_s)
                continue
            ended = None
            if run.metrics.height != last_records:
                last_records, last_change = run.metrics.height, time.monotonic()
                body = json.loads(render(analyze_run(run), None, "json"))
                last_step = int(run.metrics["step"].max()) if run.metrics.height else None
                end = final_step or final_step_of(run.meta)
                if end is not None and last_step is not None and last_step >= end:
                    ended = f"the run reached its final step {end}"
                _alert(confirmer.update(str(run_dir), inc.alerts_of(body), body, last_step, final=ended is not None),
                       seen, body, run_dir, last_step, hooks, echo)
                if body.get("verdict") == Verdict.ANOMALY and seen:
                    echo(body.get("summary", "anomaly"))
                    return 1
            elif time.monotonic() - last_change > idle_timeout_s:
                ended = f"no new record for {idle_timeout_s:g} s; the run has ended"
                _alert(confirmer.update(str(run_dir), inc.alerts_of(body or {}), body or {}, None, final=True),
                       seen, body or {}, run_dir, None, hooks, echo)
            if ended is not None:
                verdict = (body or {}).get("verdict")
                echo(f"{ended}: {(body or {}).get('summary', verdict)}")
                return 1 if verdict == Verdict.ANOMALY else 0
            time.sleep(interval_s)
    finally:
        reader.close()


def _alert(alerts: list[inc.Alert], seen: set[str], body: dict[str, Any], run_dir: Path, last_step: int | None,
           hooks: tuple[str, ...], echo: Callable[[str], None]) -> None:
    """Print and post each alert not printed before."""
    for a in alerts:
        key = a.cause or a.kind
        if key in seen:
            continue
        seen.add(key)
        onset = f"onset at step {a.onset_step}" if a.onset_step is not None else "no onset"
        read = f"alerted with step {last_step} read" if last_step is not None else "alerted after the run ended"
        echo(f"ALERT {a.kind}: {a.cause} ({a.mechanism or '-'}), {onset} (segment {a.onset_segment}); {read}: "
             f"{a.summary}")
        _post(hooks, a, body, run_dir, last_step, echo)


def _post(hooks: tuple[str, ...], a: inc.Alert, body: dict[str, Any], run_dir: Path, last_step: int | None,
          echo: Callable[[str], None]) -> None:
    incident = {"id": None, "run_id": None, "fingerprint": a.fingerprint(str(run_dir.resolve())), "kind": a.kind,
                "cause": a.cause, "mechanism": a.mechanism, "onset_step": a.onset_step,
                "onset_segment": a.onset_segment, "seen_step": last_step, "summary": a.summary,
                "opened_at": time.time(), "group_key": a.group_key(), "run_path": str(run_dir.resolve()),
                "run_name": run_dir.resolve().name}
    link = run_dir.resolve().as_uri()
    for url in hooks:
        kind, _ = webhooks.body_kind(url)
        payload = webhooks.slack_body(incident, link) if kind == "slack" else webhooks.generic_body(incident, body,
                                                                                                    link)
        err = webhooks.send_now(url, payload)
        if err:
            echo(f"forensics: webhook {url}: not delivered: {err}")
