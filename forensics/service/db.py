"""The service's database: SQLite through the standard library, WAL, a schema version and migrations.

One file (``--db``, default ``forensics-service.db`` in the working folder). Every thread gets its own
connection (SQLite connections are not shared between threads); WAL lets the web threads read while
the scheduler writes. The schema is versioned in ``schema_version``; :data:`MIGRATIONS` lists the steps
from version 0 (an empty file) upwards and :func:`migrate` applies the missing ones in one transaction
each, so an older database is upgraded in place on start.

Tables:

- ``runs``: one row per run folder found under a root (``path`` unique), with its latest verdict.
- ``analyses``: every analysis of a run (when, verdict, cause, onset, last step) with its body (the
  JSON contract of DESIGN.md section 7, as text); a body is dropped when the next analysis of the run
  says the same (verdict, cause, onset) and no incident was opened on it, so a live run's history
  costs a row per analysis, not a report per analysis.
- ``incidents``: one row per fingerprint (run, cause, onset), its kind (``anomaly``, ``early_warning``,
  ``unreadable``), status (``open``, ``acked``, ``resolved``) and the group key of recurring incidents.
- ``incident_analyses``: every later analysis of the run while the incident exists.
- ``outbox``: one row per (incident, webhook, body kind); a row marked ``sent`` is never sent again,
  so a restart of the service resends nothing.
- ``reports``: rendered reports cached per analysis.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
"""The version :func:`migrate` brings a database to."""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            root TEXT NOT NULL,
            path TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL,
            first_seen REAL NOT NULL,
            last_change REAL,
            last_analyzed REAL,
            verdict TEXT,
            cause TEXT,
            mechanism TEXT,
            onset_step INTEGER,
            onset_segment INTEGER,
            last_step INTEGER,
            analysis_id INTEGER,
            error TEXT
        );
        CREATE TABLE analyses (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            at REAL NOT NULL,
            verdict TEXT,
            cause TEXT,
            onset_step INTEGER,
            last_step INTEGER,
            duration_s REAL,
            body TEXT NOT NULL
        );
        CREATE INDEX analyses_run ON analyses(run_id, id);
        CREATE TABLE incidents (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            fingerprint TEXT NOT NULL UNIQUE,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            kind TEXT NOT NULL,
            cause TEXT,
            mechanism TEXT,
            onset_step INTEGER,
            onset_segment INTEGER,
            seen_step INTEGER,
            summary TEXT NOT NULL,
            opened_at REAL NOT NULL,
            status TEXT NOT NULL DEFAULT 'open',
            acked_at REAL,
            resolved_at REAL,
            analysis_id INTEGER
        );
        CREATE TABLE incident_analyses (
            incident_id INTEGER NOT NULL REFERENCES incidents(id),
            analysis_id INTEGER NOT NULL REFERENCES analyses(id),
            PRIMARY KEY (incident_id, analysis_id)
        );
        CREATE TABLE outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            incident_id INTEGER NOT NULL REFERENCES incidents(id),
            url TEXT NOT NULL,
            body_kind TEXT NOT NULL,
            body TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            next_at REAL NOT NULL,
            last_error TEXT,
            sent_at REAL,
            UNIQUE (incident_id, url, body_kind)
        );
        CREATE TABLE reports (
            analysis_id INTEGER NOT NULL REFERENCES analyses(id),
            fmt TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (analysis_id, fmt)
        );
    """),
    (2, """
        ALTER TABLE incidents ADD COLUMN group_key TEXT;
        ALTER TABLE incidents ADD COLUMN node TEXT;
        ALTER TABLE incidents ADD COLUMN shard TEXT;
        ALTER TABLE incidents ADD COLUMN onset_latest INTEGER;
        CREATE INDEX incidents_group ON incidents(group_key);
        CREATE INDEX incidents_run ON incidents(run_id, cause);
    """),
)
"""``(version, SQL)``: applying step N to a version N-1 database gives version N."""


def connect(path: str | Path) -> sqlite3.Connection:
    """Open ``path`` with the service's settings (WAL, foreign keys, a 10 s busy timeout, Row rows)."""
    conn = sqlite3.connect(str(path), timeout=10.0, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def version(conn: sqlite3.Connection) -> int:
    """The schema version of an open database (0 for an empty one)."""
    has = conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='schema_version'").fetchone()
    if not has:
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Apply the missing steps of :data:`MIGRATIONS` up to ``target``; returns the version reached.

    Raises:
        RuntimeError: The database is newer than this program (a downgrade is never attempted).
    """
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL)")
    current = version(conn)
    if current > SCHEMA_VERSION:
        raise RuntimeError(f"database schema version {current} is newer than this program's {SCHEMA_VERSION}")
    for v, sql in MIGRATIONS:
        if current < v <= target:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in (s.strip() for s in sql.split(";")):
                    if stmt:
                        conn.execute(stmt)
                conn.execute("INSERT INTO schema_version VALUES (?, ?)", (v, time.time()))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            current = v
    return current


class Database:
    """The service's database: thread-local connections to one SQLite file, migrated on open.

    Args:
        path: The database file (created when missing).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition()  # close() waits here until no thread is inside a query
        self._busy = 0
        self._closing = False
        migrate(self.conn())

    @contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, counted as in use while the block runs.

        Closing a connection that another thread is stepping through crashes SQLite's C library (a
        segfault seen when the service stopped while a worker thread was still recording a result), so
        :meth:`close` waits for these blocks to end.
        """
        with self._idle:
            self._idle.wait_for(lambda: not self._closing)
            self._busy += 1
        try:
            yield self.conn()
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def conn(self) -> sqlite3.Connection:
        """This thread's connection."""
        c = getattr(self._local, "conn", None)
        if c is None:
            c = connect(self.path)
            self._local.conn = c
            with self._lock:
                self._all.append(c)
        return c

    def close(self) -> None:
        """Close every connection opened through this object, once no thread is inside a query.

        Waits at most 30 s; connections are then left open rather than closed under a running query.
        """
        with self._idle:
            self._closing = True
            idle = self._idle.wait_for(lambda: self._busy == 0, timeout=30.0)
        try:
            if idle:
                self._close_all()
        finally:
            with self._idle:
                self._closing = False
                self._idle.notify_all()
        self._local = threading.local()

    def _close_all(self) -> None:
        with self._lock:
            for c in self._all:
                try:
                    c.close()
                except sqlite3.Error:
                    pass
            self._all.clear()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on error)."""
        with self._using() as c:
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of a query as dicts."""
        with self._using() as c:
            return [dict(r) for r in c.execute(sql, args).fetchall()]

    def one(self, sql: str, args: Sequence[Any] = ()) -> dict[str, Any] | None:
        """The first row of a query as a dict, or None."""
        with self._using() as c:
            r = c.execute(sql, args).fetchone()
        return dict(r) if r is not None else None

    # -- runs ------------------------------------------------------------------------------------
    def upsert_run(self, root: str, path: str, name: str) -> int:
        """The id of the run at ``path``, inserting it when new."""
        row = self.one("SELECT id FROM runs WHERE path = ?", (path,))
        if row:
            return int(row["id"])
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO runs (root, path, name, first_seen) VALUES (?, ?, ?, ?)",
                      (root, path, name, time.time()))
        return int(self.one("SELECT id FROM runs WHERE path = ?", (path,))["id"])  # type: ignore[index]

    def store_analysis(self, run_id: int, body: dict[str, Any], text: str, last_step: int | None,
                       duration: float) -> int:
        """Keep one analysis (``text``: the JSON contract, ``body``: it parsed) as the run's latest; returns its id."""
        onset = body.get("onset") or {}
        now = time.time()
        with self.tx() as c:
            prev = c.execute("SELECT a.id, a.verdict, a.cause, a.onset_step FROM runs r JOIN analyses a "
                             "ON a.id = r.analysis_id WHERE r.id = ?", (run_id,)).fetchone()
            if (prev is not None and (prev["verdict"], prev["cause"], prev["onset_step"])
                    == (body.get("verdict"), body.get("cause"), onset.get("step"))
                    and not c.execute("SELECT 1 FROM incidents WHERE analysis_id = ?", (prev["id"],)).fetchone()):
                # the same finding again on more data: keep the row (history), drop the superseded body
                c.execute("UPDATE analyses SET body = '' WHERE id = ?", (prev["id"],))
            cur = c.execute(
                "INSERT INTO analyses (run_id, at, verdict, cause, onset_step, last_step, duration_s, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, now, body.get("verdict"), body.get("cause"), onset.get("step"), last_step, duration, text))
            aid = int(cur.lastrowid)  # type: ignore[arg-type]
            c.execute("UPDATE runs SET last_analyzed=?, verdict=?, cause=?, mechanism=?, onset_step=?, "
                      "onset_segment=?, last_step=?, analysis_id=?, error=NULL WHERE id=?",
                      (now, body.get("verdict"), body.get("cause"), body.get("mechanism"), onset.get("step"),
                       onset.get("segment"), last_step, aid, run_id))
        return aid

    def store_error(self, run_id: int, message: str) -> None:
        """Mark a run unreadable (its previous analysis, if any, stays its latest)."""
        with self.tx() as c:
            c.execute("UPDATE runs SET last_analyzed=?, error=?, verdict=COALESCE(verdict, 'unreadable') "
                      "WHERE id=?", (time.time(), message, run_id))
