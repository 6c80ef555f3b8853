"""The web UI: incidents, runs, one run, compare, audit, login and the incident buttons.

Every page is a Jinja template with autoescape and ``StrictUndefined``; the incident buttons need the
session cookie (``/login``) and the CSRF field derived from the token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from datetime import UTC, datetime
from urllib.parse import parse_qs

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from forensics.model import Verdict
from forensics.service import incidents as inc
from forensics.service._http import COOKIE, VERDICTS, Http

_AUDIT_DAYS = (
    "SELECT date(at, 'unixepoch') AS day, COUNT(*) AS analyses, COUNT(DISTINCT run_id) AS runs, "
    f"SUM(verdict = '{Verdict.ANOMALY}') AS anomalies, SUM(verdict = '{Verdict.HEALTHY}') AS healthy "
    "FROM analyses GROUP BY day ORDER BY day DESC LIMIT 90"
)
_AUDIT_OPENED = ("SELECT date(opened_at, 'unixepoch') AS day, COALESCE(cause, kind) AS cause, COUNT(*) AS n "
                 "FROM incidents GROUP BY day, cause ORDER BY day DESC, n DESC")
_AUDIT_VERDICTS = "SELECT COALESCE(verdict, 'pending') AS verdict, COUNT(*) AS n FROM runs GROUP BY 1 ORDER BY n DESC"
_AUDIT_CAUSES = "SELECT cause, COUNT(*) AS n FROM runs WHERE cause IS NOT NULL GROUP BY cause ORDER BY n DESC"


def _since(text: str) -> float | None:
    """An ISO date or time (UTC) as seconds since the epoch; None when empty or not a date."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


async def _form(request: Request) -> dict[str, str]:
    raw = await request.body()
    return {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}


def pages_router(http: Http) -> APIRouter:
    """The read-only pages (``/``, ``/runs``, ``/runs/{id}``, ``/compare``, ``/audit``)."""
    router = APIRouter(include_in_schema=False)
    db, page = http.svc.db, http.page

    @router.get("/", response_class=HTMLResponse)
    def ui_incidents(request: Request, status: str | None = None) -> HTMLResponse:
        items = inc.listing(db, status if status in ("open", "acked", "resolved") else None)
        return page(request, "incidents.html.j2", incidents=items, status=status or "",
                    groups=inc.recurring(db), title="Incidents")

    @router.get("/runs", response_class=HTMLResponse)
    def ui_runs(request: Request, root: str = "", verdict: str = "", cause: str = "", since: str = "") -> HTMLResponse:
        rows = http.runs(root or None, verdict or None, cause or None, _since(since), 10000)
        causes = [r["cause"] for r in db.all("SELECT DISTINCT cause FROM runs WHERE cause IS NOT NULL")]
        return page(request, "runs.html.j2", runs=rows, roots=[str(r) for r in http.cfg.roots], verdicts=VERDICTS,
                    causes=causes, f={"root": root, "verdict": verdict, "cause": cause, "since": since}, title="Runs")

    @router.get("/runs/{run_id}", response_class=HTMLResponse)
    def ui_run(request: Request, run_id: int) -> HTMLResponse:
        r = http.run_or_404(run_id)
        body = None
        if r["analysis_id"]:
            a = db.one("SELECT body FROM analyses WHERE id=?", (r["analysis_id"],))
            body = json.loads(a["body"]) if a else None
        history = db.all("SELECT id, at, verdict, cause, onset_step, last_step FROM analyses WHERE run_id=? "
                         "ORDER BY id DESC LIMIT 50", (run_id,))
        return page(request, "run.html.j2", run=r, analysis=body, incidents=inc.listing(db, run_id=run_id),
                    history=history, title=r["name"])

    @router.get("/compare", response_class=HTMLResponse)
    def ui_compare(request: Request, a: int | None = None, b: int | None = None) -> HTMLResponse:
        runs = db.all("SELECT id, name, verdict FROM runs ORDER BY name")
        return page(request, "compare.html.j2", runs=runs, a=a, b=b, title="Compare")

    @router.get("/audit", response_class=HTMLResponse)
    def ui_audit(request: Request) -> HTMLResponse:
        return page(request, "audit.html.j2", days=db.all(_AUDIT_DAYS), opened=db.all(_AUDIT_OPENED),
                    verdicts=db.all(_AUDIT_VERDICTS), causes=db.all(_AUDIT_CAUSES), groups=inc.recurring(db),
                    title="Audit")

    return router


def session_router(http: Http) -> APIRouter:
    """Login (sets the session cookie) and the incident buttons of the UI (session + CSRF field)."""
    router = APIRouter(include_in_schema=False)

    @router.get("/login", response_class=HTMLResponse)
    def ui_login(request: Request, token: str | None = None) -> Response:
        if token is not None:
            if not hmac.compare_digest(token, http.cfg.token or ""):
                return http.page(request, "login.html.j2", error="wrong token", title="Log in")
            resp = RedirectResponse("/", status_code=303)
            resp.set_cookie(COOKIE, http.session, httponly=True, samesite="strict", secure=False)
            return resp
        return http.page(request, "login.html.j2", error="", title="Log in")

    @router.post("/login", response_class=HTMLResponse)
    async def ui_login_form(request: Request) -> Response:
        return ui_login(request, (await _form(request)).get("token", ""))

    @router.post("/ui/incidents/{incident_id}/{action}")
    async def ui_set(request: Request, incident_id: int, action: str) -> Response:
        if not http.session_ok(request):
            raise HTTPException(401, "log in first (/login)")
        form = await _form(request)
        if not hmac.compare_digest(str(form.get("csrf", "")), http.csrf):
            raise HTTPException(403, "bad form token")
        if action not in ("ack", "resolve"):
            raise HTTPException(404, "unknown action")
        await asyncio.to_thread(http.set_status, incident_id, "acked" if action == "ack" else "resolved")
        back = str(form.get("back", "/"))
        return RedirectResponse(back if back.startswith("/") and not back.startswith("//") else "/", status_code=303)

    return router
