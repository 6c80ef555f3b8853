"""The runs API: runs and their analyses, the HTML/Markdown reports, analyse-now and the compare report.

Reports and compares are rendered by the worker processes (:mod:`forensics.service.worker`), never in
this process; only the latest analysis's reports are cached per run.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Body, Depends, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from forensics.service._http import UNREADABLE, Http, run_obj
from forensics.service.worker import JobError, compare_job, report_job


def confine(http: Http, raw: str) -> tuple[Path, Path]:
    """(real path, root) of a folder inside a configured root.

    Raises:
        HTTPException: 400 for an empty or non-folder path, 403 for a ``..`` part or a path (symlinks
            followed) outside the roots, 404 when it does not exist.
    """
    cfg = http.cfg
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise HTTPException(400, "path must be a non-empty string")
    p = Path(raw)
    if ".." in p.parts:
        raise HTTPException(403, f"{raw}: '..' is not allowed in a path")
    if not p.is_absolute():
        cands = [r / p for r in cfg.roots]
        p = next((c for c in cands if c.exists()), cands[0])
    lexical = next((r for r in cfg.roots if p == r or p.is_relative_to(r)), None)
    if lexical is None:
        raise HTTPException(403, f"{raw}: outside the configured roots")
    try:
        real = p.resolve(strict=True)
    except (OSError, RuntimeError):
        raise HTTPException(404, f"{raw}: no such folder") from None
    root = http.svc.root_of(real)
    if root is None:
        raise HTTPException(403, f"{raw}: leaves the configured roots (symlink)")
    if not real.is_dir():
        raise HTTPException(400, f"{raw}: not a folder (give the run folder)")
    return real, root


async def report_text(http: Http, run_id: int, fmt: str) -> str:
    """The report of the run's latest analysis in ``fmt`` (cached in the database, rendered by a worker)."""
    svc = http.svc
    r = await asyncio.to_thread(http.run_or_404, run_id)
    if r["analysis_id"] is None:
        raise HTTPException(404, "not analysed yet")
    key = (r["analysis_id"], fmt)
    got = await asyncio.to_thread(svc.db.one, "SELECT body FROM reports WHERE analysis_id=? AND fmt=?", key)
    if got:
        return got["body"]
    link = f"{http.cfg.base_url}/api/runs/{run_id}/report.html"
    try:
        assert svc.pool is not None
        path, root = svc.real_path(r["path"]), svc.real_path(r["root"])
        text = await asyncio.to_thread(svc.pool.run, path, report_job, path, root, fmt, link)
    except JobError as exc:
        raise HTTPException(503, str(exc)) from None

    def keep() -> None:  # only the latest analysis's reports are kept per run
        with svc.db.tx() as c:
            c.execute("DELETE FROM reports WHERE analysis_id IN (SELECT id FROM analyses WHERE run_id = ? "
                      "AND id != ?)", (run_id, key[0]))
            c.execute("INSERT OR REPLACE INTO reports VALUES (?, ?, ?)", (*key, text))
    await asyncio.to_thread(keep)
    return text


def _unreadable(r: dict[str, Any]) -> JSONResponse:
    from forensics import SCHEMA_VERSION

    return JSONResponse({"schema_version": SCHEMA_VERSION, "run": r["path"],
                         "error": {"kind": UNREADABLE, "message": r["error"], "path": r["path"]}},
                        status_code=422)


def runs_router(http: Http) -> APIRouter:
    """The ``/api/runs`` routes that read the database: runs, their latest analysis, their history."""
    router = APIRouter(tags=["runs"])
    svc = http.svc

    @router.get("/api/runs")
    def list_runs(root: str | None = None, verdict: str | None = None, cause: str | None = None,
                  since: float | None = Query(None, description="last analysed at or after (s since epoch)"),
                  limit: int = Query(1000, ge=1, le=10000)) -> list[dict[str, Any]]:
        """The runs under the roots with their latest verdict, cause and onset."""
        return [run_obj(r) for r in http.runs(root, verdict, cause, since, limit)]

    @router.get("/api/runs/{run_id}")
    def get_run(run_id: int) -> dict[str, Any]:
        """One run."""
        return run_obj(http.run_or_404(run_id))

    @router.get("/api/runs/{run_id}/analysis")
    def get_analysis(run_id: int) -> Response:
        """The run's latest analysis: the ``forensics analyze -f json`` contract."""
        r = http.run_or_404(run_id)
        if r["analysis_id"] is None:
            if r["error"]:
                return _unreadable(r)
            raise HTTPException(404, "not analysed yet")
        a = svc.db.one("SELECT body FROM analyses WHERE id = ?", (r["analysis_id"],))
        return Response(a["body"], media_type="application/json")  # type: ignore[index]

    @router.get("/api/runs/{run_id}/analyses")
    def get_analyses(run_id: int, limit: int = Query(200, ge=1, le=5000)) -> list[dict[str, Any]]:
        """Every analysis of the run kept in the database (newest first), without the bodies."""
        http.run_or_404(run_id)
        return svc.db.all("SELECT id, at, verdict, cause, onset_step, last_step, duration_s FROM analyses "
                          "WHERE run_id = ? ORDER BY id DESC LIMIT ?", (run_id, limit))

    return router


def jobs_router(http: Http) -> APIRouter:
    """The routes whose work a worker process does: reports, analyse-now (bearer token) and compare."""
    router = APIRouter(tags=["runs"])
    svc = http.svc

    @router.get("/api/runs/{run_id}/report.html", response_class=HTMLResponse)
    async def report_html(run_id: int) -> HTMLResponse:
        """The run's HTML report (the same self-contained file ``forensics analyze`` writes)."""
        return HTMLResponse(await report_text(http, run_id, "html"))

    @router.get("/api/runs/{run_id}/report.md", response_class=PlainTextResponse)
    async def report_md(run_id: int) -> PlainTextResponse:
        """The run's Markdown report, ready to paste into a ticket."""
        text = await report_text(http, run_id, "markdown")
        return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")

    @router.post("/api/analyze", dependencies=[Depends(http.require_write)])
    async def analyze_now(payload: dict[str, Any] = Body(..., examples=[{"path": "my_run"}])) -> dict[str, Any]:  # noqa: B008
        """Analyse a run folder under a configured root now (needs the bearer token)."""
        real, root = confine(http, payload.get("path"))  # type: ignore[arg-type]
        row = await svc.analyze(str(root), str(real))
        body = None
        if row.get("analysis_id"):
            a = await asyncio.to_thread(svc.db.one, "SELECT body FROM analyses WHERE id=?", (row["analysis_id"],))
            body = json.loads(a["body"]) if a else None
        return {"run": run_obj(row), "analysis": body}

    @router.get("/api/compare.html", response_class=HTMLResponse)
    async def compare_html(a: int, b: int) -> HTMLResponse:
        """The compare report of run ``a`` (the proxy, the one that trained well) and run ``b`` (the target)."""
        ra, rb = await asyncio.to_thread(http.run_or_404, a), await asyncio.to_thread(http.run_or_404, b)
        try:
            assert svc.pool is not None
            real = svc.real_path
            text = await asyncio.to_thread(svc.pool.run, real(rb["path"]), compare_job, real(ra["path"]),
                                           real(ra["root"]), real(rb["path"]), real(rb["root"]))
        except JobError as exc:
            raise HTTPException(503, str(exc)) from None
        return HTMLResponse(text)

    return router
