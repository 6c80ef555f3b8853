"""Incidents: what in an analysis is worth an alert, opened once per fingerprint, grouped when recurring.

An analysis (the JSON contract) yields alerts (:func:`alerts_of`):

- ``anomaly``: the verdict is ``anomaly``; cause, mechanism and onset are the analysis's.
- ``early_warning``: the verdict is not (yet) ``anomaly`` but a finding says the run is heading there:
  a growth precursor (a finding of cause ``update_scale_growth`` with confidence >= 0.5, the same
  bar ``forensics.api`` uses for ``growth_precursor`` evidence) or the beginning of a loss-scale
  collapse (``OV01``). Onset = the finding's step.
- ``unreadable``: the run could not be read or analysed (the error's one line is the summary).

Confirmation (:class:`Confirmer`): on a live run the analysis sees only a prefix, and a trend detector
can place an "onset" just behind the end of the data that moves forward as the data grows (on the
healthy sample run, an ``update_scale_growth`` onset at 50, 51, 52, ... 91 while steps 55-120 arrive,
gone afterwards). A real departure stays where it is. So an alert is raised only once the same cause
has kept its onset within :data:`ONSET_TOLERANCE` steps while at least :data:`CONFIRM_STEPS` new steps
arrived, except when the analysis holds a ``critical`` finding (non-finite loss or state, an fp16
overflow): that evidence does not depend on what comes next, and the alert is raised at once. A run
that has stopped changing (its newest log older than the settle time, ``--settle``: a finished run
seen for the first time, or a live run that stopped after the onset) is final: its alerts are raised
as they stand, as ``forensics analyze`` would report them.

Fingerprint = (run, cause or kind, onset). :func:`record` opens an incident for a new fingerprint,
unless the run already has an unresolved incident for the same cause: a live run's onset estimate can
move by a few steps as data arrives, and that is the same incident (its ``onset_latest`` is updated and
the analysis attached), not a new alert. Every later analysis of the run is attached to its unresolved
incidents (``incident_analyses``).

Recurring incidents: ``group_key`` = cause (or kind) plus the node and the data shard when the
evidence names them (keys such as ``node``/``host``/``rank`` and ``shard``/``data_file``), else
cause + mechanism. Incidents of two or more runs with the same key are one recurring group.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forensics.model import Cause, Severity, Verdict
from forensics.service.db import Database

PRECURSOR_CONFIDENCE = 0.5
"""Confidence at which an ``update_scale_growth`` finding is a precursor (as ``forensics.api``'s growth_precursor)."""
EARLY_CODES = ("OV01",)
"""Finding codes that are an early warning by themselves (loss-scale collapse beginning)."""
CONFIRM_STEPS = 32
"""New steps an onset must survive before a non-critical alert is raised (a quarter of the engine's 128-point
trailing window: enough for a trend fit to see the data past the onset)."""
ONSET_TOLERANCE = 2
"""Steps an onset may move while it is being confirmed (grad norm leads the loss by 1-4 steps, DESIGN.md section 4)."""
_NODE_KEYS = ("node", "host", "hostname", "rank", "gpu", "device")
_SHARD_KEYS = ("shard", "data_shard", "data_file", "dataset_file")


@dataclass(frozen=True)
class Alert:
    """One thing to alert on, from one analysis."""

    kind: str
    cause: str | None
    mechanism: str | None
    onset_step: int | None
    onset_segment: int | None
    summary: str
    node: str | None = None
    shard: str | None = None

    def fingerprint(self, run_path: str) -> str:
        """``run|cause|segment:step``, the identity of an incident."""
        onset = f"{self.onset_segment}:{self.onset_step}" if self.onset_step is not None else "-"
        return f"{run_path}|{self.cause or self.kind}|{onset}"

    def group_key(self) -> str:
        """The key recurring incidents share (module docstring)."""
        key = self.cause or self.kind
        if self.node or self.shard:
            return key + (f"|node={self.node}" if self.node else "") + (f"|shard={self.shard}" if self.shard else "")
        return f"{key}|{self.mechanism or '-'}"


def _find(obj: Any, keys: tuple[str, ...], depth: int = 0) -> str | None:
    if depth > 4:
        return None
    if isinstance(obj, dict):
        for k, v in obj.items():
            if str(k).lower() in keys and isinstance(v, (str, int)) and not isinstance(v, bool):
                return str(v)
        for v in obj.values():
            got = _find(v, keys, depth + 1)
            if got is not None:
                return got
    elif isinstance(obj, list):
        for v in obj[:50]:
            got = _find(v, keys, depth + 1)
            if got is not None:
                return got
    return None


def alerts_of(body: dict[str, Any]) -> list[Alert]:
    """The alerts one analysis (the JSON contract as a dict) raises (module docstring)."""
    findings = body.get("findings") or []
    if body.get("verdict") == Verdict.ANOMALY:
        onset = body.get("onset") or {}
        mine = [f for f in findings if f.get("cause") == body.get("cause")]
        return [Alert("anomaly", body.get("cause"), body.get("mechanism"), onset.get("step"), onset.get("segment"),
                      body.get("summary") or f"anomaly: {body.get('cause')}",
                      node=_find(mine, _NODE_KEYS), shard=_find(mine, _SHARD_KEYS))]
    early = [f for f in findings
             if f.get("step") is not None
             and ((f.get("cause") == Cause.UPDATE_SCALE_GROWTH
                   and float(f.get("confidence") or 0) >= PRECURSOR_CONFIDENCE)
                  or f.get("code") in EARLY_CODES)]
    if not early:
        return []
    f = min(early, key=lambda f: f["step"])
    cause = f.get("cause") or (Cause.OVERFLOW if f.get("code") == "OV01" else None)
    msg = f"early warning: {f.get('code')} {f.get('name')} at step {f['step']}: {f.get('message', '')}".strip()
    return [Alert("early_warning", cause, f.get("mechanism"), int(f["step"]), f.get("segment"), msg[:500],
                  node=_find(f, _NODE_KEYS), shard=_find(f, _SHARD_KEYS))]


class Confirmer:
    """Raises an alert once its onset is stable (module docstring); one instance follows many runs."""

    def __init__(self, confirm_steps: int = CONFIRM_STEPS, tolerance: int = ONSET_TOLERANCE) -> None:
        self.confirm_steps, self.tolerance = confirm_steps, tolerance
        self._cand: dict[tuple[str, str], tuple[int | None, int | None, int]] = {}  # -> (segment, onset, since)

    def update(self, run: str, alerts: list[Alert], body: dict[str, Any], last_step: int | None,
               final: bool = False) -> list[Alert]:
        """The alerts of this analysis that are confirmed now (or were, and still are).

        Args:
            run: The run's key.
            alerts: :func:`alerts_of` this analysis.
            body: The analysis (the JSON contract).
            last_step: The last step read.
            final: The run has stopped changing: every alert stands as it is.
        """
        critical = final or any(f.get("severity") == Severity.CRITICAL for f in body.get("findings") or [])
        out, live = [], set()
        for a in alerts:
            key = (run, a.cause or a.kind)
            live.add(key)
            if critical or a.kind == "unreadable" or last_step is None:
                out.append(a)
                continue
            cand = self._cand.get(key)
            if (cand is None or cand[0] != a.onset_segment or a.onset_step is None or cand[1] is None
                    or abs(a.onset_step - cand[1]) > self.tolerance):
                self._cand[key] = (a.onset_segment, a.onset_step, last_step)
                continue
            if last_step - cand[2] >= self.confirm_steps:
                out.append(a)
        for key in [k for k in self._cand if k[0] == run and (k not in live or critical)]:
            del self._cand[key]
        return out

    def pending(self, run: str) -> bool:
        """True while an alert of ``run`` waits for confirmation."""
        return any(k[0] == run for k in self._cand)


def unreadable(message: str) -> Alert:
    """The alert of a run that cannot be read."""
    return Alert("unreadable", None, None, None, None, message[:500])


def record(db: Database, run_id: int, run_path: str, alerts: list[Alert], analysis_id: int | None,
           seen_step: int | None, on_open: Callable[[sqlite3.Connection, int], None] | None = None) -> list[int]:
    """Open the incidents of new fingerprints and attach the analysis to the run's unresolved ones.

    Args:
        db: The database.
        run_id: The run's id.
        run_path: The run's real path (part of the fingerprint).
        alerts: The confirmed alerts of this analysis.
        analysis_id: The analysis to attach (None for an unreadable run).
        seen_step: The last step read (kept: the step at which the alert was raised).
        on_open: Called as ``on_open(connection, incident_id)`` inside the same transaction for each
            incident opened (the outbox rows: an incident and its webhook rows commit together).

    Returns:
        The ids of the incidents opened now.
    """
    opened: list[int] = []
    now = time.time()
    with db.tx() as c:
        for a in alerts:
            fp = a.fingerprint(run_path)
            same = c.execute("SELECT id FROM incidents WHERE fingerprint = ?", (fp,)).fetchone()
            if same is None:
                same = c.execute("SELECT id FROM incidents WHERE run_id = ? AND COALESCE(cause, kind) = ? "
                                 "AND status != 'resolved' ORDER BY id LIMIT 1", (run_id, a.cause or a.kind)).fetchone()
                if same is not None:
                    c.execute("UPDATE incidents SET onset_latest = ?, kind = CASE WHEN ? = 'anomaly' THEN 'anomaly' "
                              "ELSE kind END WHERE id = ?", (a.onset_step, a.kind, same[0]))
            if same is None:
                cur = c.execute(
                    "INSERT INTO incidents (fingerprint, run_id, kind, cause, mechanism, onset_step, onset_segment, "
                    "seen_step, summary, opened_at, analysis_id, group_key, node, shard, onset_latest) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (fp, run_id, a.kind, a.cause, a.mechanism, a.onset_step, a.onset_segment, seen_step, a.summary,
                     now, analysis_id, a.group_key(), a.node, a.shard, a.onset_step))
                opened.append(int(cur.lastrowid))  # type: ignore[arg-type]
                if on_open is not None:
                    on_open(c, opened[-1])
        if analysis_id is not None:
            c.execute("INSERT OR IGNORE INTO incident_analyses SELECT id, ? FROM incidents "
                      "WHERE run_id = ? AND status != 'resolved'", (analysis_id, run_id))
    return opened


def set_status(db: Database, incident_id: int, status: str) -> dict[str, Any] | None:
    """Acknowledge (``acked``) or resolve (``resolved``) an incident; None when it does not exist."""
    col = {"acked": "acked_at", "resolved": "resolved_at"}[status]
    with db.tx() as c:
        cur = c.execute(f"UPDATE incidents SET status = ?, {col} = COALESCE({col}, ?) WHERE id = ?",  # noqa: S608
                        (status, time.time(), incident_id))
        if cur.rowcount == 0:
            return None
    return get(db, incident_id)


_SELECT = ("SELECT i.*, r.path AS run_path, r.name AS run_name, r.root AS run_root, "
           "(SELECT COUNT(DISTINCT j.run_id) FROM incidents j WHERE j.group_key = i.group_key) AS group_runs, "
           "(SELECT COUNT(*) FROM incident_analyses x WHERE x.incident_id = i.id) AS analyses "
           "FROM incidents i JOIN runs r ON r.id = i.run_id")


def get(db: Database, incident_id: int, conn: sqlite3.Connection | None = None) -> dict[str, Any] | None:
    """One incident with its run's path and group size (through ``conn`` inside a transaction)."""
    if conn is not None:
        row = conn.execute(_SELECT + " WHERE i.id = ?", (incident_id,)).fetchone()
        return dict(row) if row is not None else None
    return db.one(_SELECT + " WHERE i.id = ?", (incident_id,))


def listing(db: Database, status: str | None = None, run_id: int | None = None, group: str | None = None,
            limit: int = 500) -> list[dict[str, Any]]:
    """Incidents, newest first, optionally filtered."""
    where, args = [], []
    if status:
        where.append("i.status = ?")
        args.append(status)
    if run_id is not None:
        where.append("i.run_id = ?")
        args.append(run_id)
    if group:
        where.append("i.group_key = ?")
        args.append(group)
    sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY i.id DESC LIMIT ?"
    return db.all(sql, (*args, limit))


def recurring(db: Database) -> list[dict[str, Any]]:
    """Groups of incidents seen in two or more runs: key, runs, incidents, first and last opened."""
    return db.all("SELECT group_key, COUNT(DISTINCT run_id) AS runs, COUNT(*) AS incidents, "
                  "MIN(opened_at) AS first_at, MAX(opened_at) AS last_at, MIN(cause) AS cause FROM incidents "
                  "GROUP BY group_key HAVING COUNT(DISTINCT run_id) >= 2 ORDER BY runs DESC, last_at DESC")
