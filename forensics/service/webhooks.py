"""Webhooks: the bodies an incident is sent as, the outbox, and delivery with retries and backoff.

Each ``--webhook URL`` receives one body per incident: the generic JSON body (``{"event":
"incident.opened", "incident": {...}, "analysis": <the JSON contract>, "link": URL}``) or, for a URL
given as ``slack:https://...`` or one on ``hooks.slack.com``, a Slack-compatible body (``text`` plus
``blocks`` with a link; Slack's incoming-webhook format).

Delivery goes through the ``outbox`` table: the rows are written in the same transaction as the
incident (one per incident, URL and body kind, a UNIQUE key), and a row is marked ``sent`` when the
receiver answers 2xx. A restart sends only what is still ``pending``, so nothing is sent twice (the
``Idempotency-Key`` header carries the incident fingerprint for a receiver that wants to dedupe a
send whose answer was lost). Retries: exponential backoff from 1 s, doubling, at most 5 min apart,
with jitter; after :data:`MAX_ATTEMPTS` a row is ``failed`` (kept, shown in ``/metrics``).
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from typing import Any

import httpx

from forensics.service.db import Database

MAX_ATTEMPTS = 8
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 300.0
TIMEOUT_S = 10.0


def body_kind(url: str) -> tuple[str, str]:
    """``(kind, url)``: ``slack`` for ``slack:URL`` and hooks.slack.com URLs, else ``json``."""
    if url.startswith("slack:"):
        return "slack", url[len("slack:"):]
    if "hooks.slack.com/" in url:
        return "slack", url
    return "json", url


def generic_body(incident: dict[str, Any], analysis: dict[str, Any] | None, link: str) -> dict[str, Any]:
    """The generic JSON body: the incident, the analysis (the JSON contract) and a link to it."""
    inc = {k: incident.get(k) for k in ("id", "fingerprint", "kind", "cause", "mechanism", "onset_step",
                                         "onset_segment", "seen_step", "summary", "opened_at", "group_key",
                                         "node", "shard", "run_path", "run_name")}
    return {"event": "incident.opened", "incident": inc, "analysis": analysis, "link": link}


def slack_body(incident: dict[str, Any], link: str) -> dict[str, Any]:
    """A Slack incoming-webhook body (``text`` fallback plus blocks)."""
    onset = incident.get("onset_step")
    title = (f"{incident.get('kind')}: {incident.get('cause') or 'unreadable'} in {incident.get('run_name')}"
             + (f", onset at step {onset}" if onset is not None else ""))
    text = f"{title}\n{incident.get('summary', '')}\n<{link}|open the report>"
    return {"text": text, "blocks": [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{title}*\n{incident.get('summary', '')}"}},
        {"type": "actions", "elements": [{"type": "button", "text": {"type": "plain_text", "text": "Open report"},
                                          "url": link}]},
    ]}


def enqueue(conn: sqlite3.Connection, incident: dict[str, Any], analysis: dict[str, Any] | None, base_url: str,
            webhooks: list[str]) -> int:
    """Write one outbox row per webhook for a newly opened incident (inside the caller's transaction).

    Returns:
        The rows added.
    """
    link = f"{base_url.rstrip('/')}/runs/{incident['run_id']}#incident-{incident['id']}"
    added = 0
    for raw in webhooks:
        kind, url = body_kind(raw)
        body = slack_body(incident, link) if kind == "slack" else generic_body(incident, analysis, link)
        cur = conn.execute("INSERT OR IGNORE INTO outbox (incident_id, url, body_kind, body, next_at) "
                           "VALUES (?, ?, ?, ?, ?)", (incident["id"], url, kind, json.dumps(body, default=str),
                                                      time.time()))
        added += cur.rowcount
    return added


def _backoff(attempts: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, attempts - 1)) * (0.75 + 0.5 * random.random())


def _headers(db: Database, row: dict[str, Any]) -> dict[str, str]:
    fp = db.one("SELECT fingerprint FROM incidents WHERE id = ?", (row["incident_id"],))
    return {"Content-Type": "application/json", "User-Agent": "train-forensics",
            "Idempotency-Key": f"{(fp or {}).get('fingerprint', row['incident_id'])}|{row['body_kind']}"}


def _outcome(db: Database, row: dict[str, Any], ok: bool, error: str | None) -> None:
    now = time.time()
    with db.tx() as c:
        if ok:
            c.execute("UPDATE outbox SET status='sent', sent_at=?, attempts=attempts+1, last_error=NULL WHERE id=?",
                      (now, row["id"]))
            return
        attempts = row["attempts"] + 1
        status = "failed" if attempts >= MAX_ATTEMPTS else "pending"
        c.execute("UPDATE outbox SET status=?, attempts=?, next_at=?, last_error=? WHERE id=?",
                  (status, attempts, now + _backoff(attempts), (error or "")[:300], row["id"]))


def due(db: Database, limit: int = 50) -> list[dict[str, Any]]:
    """Pending outbox rows whose time has come."""
    return db.all("SELECT * FROM outbox WHERE status='pending' AND next_at <= ? ORDER BY id LIMIT ?",
                  (time.time(), limit))


async def deliver_due(db: Database, client: httpx.AsyncClient) -> int:
    """Send every due row once (async); returns how many were sent successfully."""
    rows = await asyncio.to_thread(due, db)
    sent = 0
    for row in rows:
        headers = await asyncio.to_thread(_headers, db, row)
        try:
            r = await client.post(row["url"], content=row["body"].encode(), headers=headers, timeout=TIMEOUT_S)
            ok, err = 200 <= r.status_code < 300, f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            ok, err = False, f"{type(exc).__name__}: {exc}"
        await asyncio.to_thread(_outcome, db, row, ok, None if ok else err)
        sent += ok
    return sent


async def deliver_forever(db: Database, wake: asyncio.Event, stop: asyncio.Event, poll_s: float = 1.0) -> None:
    """The service's delivery loop: send due rows, then sleep until woken or ``poll_s`` passes."""
    async with httpx.AsyncClient() as client:
        while not stop.is_set():
            try:
                await deliver_due(db, client)
            except Exception:  # noqa: BLE001 - delivery must never stop; the row stays pending
                pass
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), timeout=poll_s)
            except TimeoutError:
                pass


def send_now(url: str, body: dict[str, Any], attempts: int = 4) -> str | None:
    """Post one body with retries and backoff (``forensics watch``); None on success, else the last error."""
    kind, target = body_kind(url)
    err = None
    for i in range(attempts):
        try:
            r = httpx.post(target, json=body, timeout=TIMEOUT_S)
            if 200 <= r.status_code < 300:
                return None
            err = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            err = f"{type(exc).__name__}: {exc}"
        if i + 1 < attempts:
            time.sleep(_backoff(i + 1))
    return err
