"""The HTTP side of ``forensics serve``: the JSON API (OpenAPI at ``/openapi.json``) and the web UI.

Built with FastAPI (Starlette) and served by uvicorn. Read handlers are plain functions (run in
Starlette's thread pool, each thread with its own SQLite connection); analyses and report rendering
go to the worker processes (:mod:`forensics.service.worker`), never into this process.

Safety:

- writes (``POST``) need ``Authorization: Bearer TOKEN``; the UI's forms need the session cookie set
  by ``/login`` and a CSRF field derived from the token; on a non-loopback bind every route but
  ``/healthz`` needs the token (the CLI refuses such a bind without ``--token``);
- ``POST /api/analyze`` takes only a folder inside a configured root: a path with a ``..`` part is
  refused, and so is one whose real path (symlinks followed) leaves the root;
- request bodies are limited to ``max_body_bytes`` (413), analyses and renders to the time limit;
- every page is a Jinja template with autoescape and ``StrictUndefined``; the run's report is served
  as its own document inside a sandboxed iframe; a Content-Security-Policy allows nothing but this
  origin (no CDN: the pages need none).
"""

import asyncio
import hashlib
import hmac
import json
import time
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

import reports
from forensics.service import incidents as inc
from forensics.service.scheduler import Service, ServiceConfig
from forensics.service.worker import JobError, compare_job, report_job

TEMPLATES = Path(reports.__file__).resolve().parent / "templates" / "service"
COOKIE = "forensics_session"
_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; frame-src 'self'; frame-ancestors 'self'; form-action 'self'; base-uri 'none'")
_VERDICTS = ("healthy", "anomaly", "transient", "inconclusive", "unreadable")


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with 413 (declared or streamed)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """Pass the request on, with its body counted."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", []):
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                await _plain(send, 413, b"request body too large\n")
                return
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, "request body too large")
            return msg

        await self.app(scope, limited, send)


async def _plain(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["ts"] = lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t else ""
    return env


def _run_obj(r: dict[str, Any]) -> dict[str, Any]:
    onset = {"step": r["onset_step"], "segment": r["onset_segment"]} if r.get("onset_step") is not None else None
    return {"id": r["id"], "path": r["path"], "name": r["name"], "root": r["root"], "verdict": r["verdict"],
            "cause": r["cause"], "mechanism": r["mechanism"], "onset": onset, "last_step": r["last_step"],
            "last_analyzed": r["last_analyzed"], "analysis_id": r["analysis_id"], "error": r["error"],
            "links": {"analysis": f"/api/runs/{r['id']}/analysis", "report_html": f"/api/runs/{r['id']}/report.html",
                      "report_md": f"/api/runs/{r['id']}/report.md", "page": f"/runs/{r['id']}"}}


def _incident_obj(i: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "fingerprint", "run_id", "run_path", "run_name", "kind", "cause", "mechanism", "onset_step",
            "onset_segment", "onset_latest", "seen_step", "summary", "opened_at", "status", "acked_at",
            "resolved_at", "group_key", "group_runs", "node", "shard", "analyses")
    return {k: i.get(k) for k in keys}


def create_app(cfg: ServiceConfig) -> FastAPI:
    """The ASGI application of one service (its lifespan starts workers, watcher and loops)."""
    svc = Service(cfg)
    env = _env()
    token = cfg.token or ""
    session = hmac.new(token.encode(), b"session", hashlib.sha256).hexdigest()
    csrf = hmac.new(token.encode(), b"csrf", hashlib.sha256).hexdigest()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        await svc.start()
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(title="train-forensics service", version="1", lifespan=lifespan,
                  description="Watches training runs, opens incidents at the onset, serves the reports.")
    app.state.service = svc

    def _bearer_ok(request: Request) -> bool:
        h = request.headers.get("authorization", "")
        return h.startswith("Bearer ") and hmac.compare_digest(h[7:].strip(), token)

    def _session_ok(request: Request) -> bool:
        return hmac.compare_digest(request.cookies.get(COOKIE, ""), session)

    def require_write(request: Request) -> None:
        if not _bearer_ok(request):
            raise HTTPException(401, "a bearer token is required (Authorization: Bearer TOKEN)",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if (not cfg.loopback and path not in ("/healthz", "/login") and not _bearer_ok(request)
                and not _session_ok(request)):
            return JSONResponse({"detail": "a bearer token is required on this bind"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        resp = await call_next(request)
        resp.headers.setdefault("Content-Security-Policy", _CSP)
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("Referrer-Policy", "no-referrer")
        return resp

    def _run_or_404(run_id: int) -> dict[str, Any]:
        r = svc.db.one("SELECT * FROM runs WHERE id = ?", (run_id,))
        if r is None:
            raise HTTPException(404, f"no run {run_id}")
        return r

    # -- API -----------------------------------------------------------------------------------------
    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, Any]:
        """Liveness: the service answers and its database is readable."""
        n = svc.db.one("SELECT COUNT(*) AS n FROM runs") or {"n": 0}
        return {"ok": True, "runs": n["n"], "analyses": svc.analyses_done, "uptime_s": time.time() - svc.started}

    @app.get("/api/runs", tags=["runs"])
    def list_runs(root: str | None = None, verdict: str | None = None, cause: str | None = None,
                  since: float | None = Query(None, description="last analysed at or after (s since epoch)"),
                  limit: int = Query(1000, ge=1, le=10000)) -> list[dict[str, Any]]:
        """The runs under the roots with their latest verdict, cause and onset."""
        return [_run_obj(r) for r in _runs(root, verdict, cause, since, limit)]

    def _runs(root: str | None, verdict: str | None, cause: str | None, since: float | None,
              limit: int) -> list[dict[str, Any]]:
        where, args = [], []
        for col, val in (("root", root), ("verdict", verdict), ("cause", cause)):
            if val:
                where.append(f"{col} = ?")
                args.append(val)
        if since is not None:
            where.append("last_analyzed >= ?")
            args.append(since)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY name LIMIT ?"
        return svc.db.all(sql, (*args, limit))

    @app.get("/api/runs/{run_id}", tags=["runs"])
    def get_run(run_id: int) -> dict[str, Any]:
        """One run."""
        return _run_obj(_run_or_404(run_id))

    @app.get("/api/runs/{run_id}/analysis", tags=["runs"])
    def get_analysis(run_id: int) -> Response:
        """The run's latest analysis: the ``forensics analyze -f json`` contract."""
        r = _run_or_404(run_id)
        if r["analysis_id"] is None:
            if r["error"]:
                from forensics import SCHEMA_VERSION

                return JSONResponse({"schema_version": SCHEMA_VERSION, "run": r["path"],
                                     "error": {"kind": "unreadable", "message": r["error"], "path": r["path"]}},
                                    status_code=422)
            raise HTTPException(404, "not analysed yet")
        a = svc.db.one("SELECT body FROM analyses WHERE id = ?", (r["analysis_id"],))
        return Response(a["body"], media_type="application/json")  # type: ignore[index]

    @app.get("/api/runs/{run_id}/analyses", tags=["runs"])
    def get_analyses(run_id: int, limit: int = Query(200, ge=1, le=5000)) -> list[dict[str, Any]]:
        """Every analysis of the run kept in the database (newest first), without the bodies."""
        _run_or_404(run_id)
        return svc.db.all("SELECT id, at, verdict, cause, onset_step, last_step, duration_s FROM analyses "
                          "WHERE run_id = ? ORDER BY id DESC LIMIT ?", (run_id, limit))

    async def _report(run_id: int, fmt: str) -> str:
        r = await asyncio.to_thread(_run_or_404, run_id)
        if r["analysis_id"] is None:
            raise HTTPException(404, "not analysed yet")
        key = (r["analysis_id"], fmt)
        got = await asyncio.to_thread(svc.db.one, "SELECT body FROM reports WHERE analysis_id=? AND fmt=?", key)
        if got:
            return got["body"]
        link = f"{cfg.base_url}/api/runs/{run_id}/report.html"
        try:
            assert svc.pool is not None
            text = await asyncio.to_thread(svc.pool.run, r["path"], report_job, r["path"], r["root"], fmt, link)
        except JobError as exc:
            raise HTTPException(503, str(exc)) from None

        def keep() -> None:  # only the latest analysis's reports are kept per run
            with svc.db.tx() as c:
                c.execute("DELETE FROM reports WHERE analysis_id IN (SELECT id FROM analyses WHERE run_id = ? "
                          "AND id != ?)", (run_id, key[0]))
                c.execute("INSERT OR REPLACE INTO reports VALUES (?, ?, ?)", (*key, text))
        await asyncio.to_thread(keep)
        return text

    @app.get("/api/runs/{run_id}/report.html", tags=["runs"], response_class=HTMLResponse)
    async def report_html(run_id: int) -> HTMLResponse:
        """The run's HTML report (the same self-contained file ``forensics analyze`` writes)."""
        return HTMLResponse(await _report(run_id, "html"))

    @app.get("/api/runs/{run_id}/report.md", tags=["runs"], response_class=PlainTextResponse)
    async def report_md(run_id: int) -> PlainTextResponse:
        """The run's Markdown report, ready to paste into a ticket."""
        return PlainTextResponse(await _report(run_id, "markdown"), media_type="text/markdown; charset=utf-8")

    @app.get("/api/incidents", tags=["incidents"])
    def list_incidents(status: str | None = Query(None, pattern="^(open|acked|resolved)$"),
                       run: int | None = None, group: str | None = None,
                       limit: int = Query(500, ge=1, le=10000)) -> list[dict[str, Any]]:
        """Incidents, newest first."""
        return [_incident_obj(i) for i in inc.listing(svc.db, status, run, group, limit)]

    @app.get("/api/incidents/groups", tags=["incidents"])
    def incident_groups() -> list[dict[str, Any]]:
        """Recurring incidents: groups (cause + node/shard when known) seen in two or more runs."""
        return inc.recurring(svc.db)

    @app.get("/api/incidents/{incident_id}", tags=["incidents"])
    def get_incident(incident_id: int) -> dict[str, Any]:
        """One incident."""
        i = inc.get(svc.db, incident_id)
        if i is None:
            raise HTTPException(404, f"no incident {incident_id}")
        return _incident_obj(i)

    def _set(incident_id: int, status: str) -> dict[str, Any]:
        i = inc.set_status(svc.db, incident_id, status)
        if i is None:
            raise HTTPException(404, f"no incident {incident_id}")
        return _incident_obj(i)

    @app.post("/api/incidents/{incident_id}/ack", tags=["incidents"], dependencies=[Depends(require_write)])
    def ack(incident_id: int) -> dict[str, Any]:
        """Acknowledge an incident (needs the bearer token)."""
        return _set(incident_id, "acked")

    @app.post("/api/incidents/{incident_id}/resolve", tags=["incidents"], dependencies=[Depends(require_write)])
    def resolve(incident_id: int) -> dict[str, Any]:
        """Resolve an incident (needs the bearer token)."""
        return _set(incident_id, "resolved")

    def confine(raw: str) -> tuple[Path, Path]:
        """(real path, root) of a folder inside a root; 403/404 otherwise."""
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
        root = svc.root_of(real)
        if root is None:
            raise HTTPException(403, f"{raw}: leaves the configured roots (symlink)")
        if not real.is_dir():
            raise HTTPException(400, f"{raw}: not a folder (give the run folder)")
        return real, root

    @app.post("/api/analyze", tags=["runs"], dependencies=[Depends(require_write)])
    async def analyze_now(payload: dict[str, Any] = Body(..., examples=[{"path": "my_run"}])) -> dict[str, Any]:  # noqa: B008
        """Analyse a run folder under a configured root now (needs the bearer token)."""
        real, root = confine(payload.get("path"))  # type: ignore[arg-type]
        row = await svc.analyze(str(root), str(real))
        body = None
        if row.get("analysis_id"):
            a = await asyncio.to_thread(svc.db.one, "SELECT body FROM analyses WHERE id=?", (row["analysis_id"],))
            body = json.loads(a["body"]) if a else None
        return {"run": _run_obj(row), "analysis": body}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus text format: runs by verdict, incidents open, analysis latency, watcher lag."""
        return Response(svc.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/api/compare.html", tags=["runs"], response_class=HTMLResponse)
    async def compare_html(a: int, b: int) -> HTMLResponse:
        """The compare report of run ``a`` (the proxy, the one that trained well) and run ``b`` (the target)."""
        ra, rb = await asyncio.to_thread(_run_or_404, a), await asyncio.to_thread(_run_or_404, b)
        try:
            assert svc.pool is not None
            text = await asyncio.to_thread(svc.pool.run, rb["path"], compare_job, ra["path"], ra["root"], rb["path"],
                                           rb["root"])
        except JobError as exc:
            raise HTTPException(503, str(exc)) from None
        return HTMLResponse(text)

    # -- UI ------------------------------------------------------------------------------------------
    def page(request: Request, name: str, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("title", "train-forensics")
        html = env.get_template(name).render(logged_in=_session_ok(request), csrf=csrf if _session_ok(request) else "",
                                             nav=name, **ctx)
        return HTMLResponse(html)

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    def ui_incidents(request: Request, status: str | None = None) -> HTMLResponse:
        items = inc.listing(svc.db, status if status in ("open", "acked", "resolved") else None)
        return page(request, "incidents.html.j2", incidents=items, status=status or "",
                    groups=inc.recurring(svc.db), title="Incidents")

    @app.get("/runs", include_in_schema=False, response_class=HTMLResponse)
    def ui_runs(request: Request, root: str = "", verdict: str = "", cause: str = "", since: str = "") -> HTMLResponse:
        since_t = None
        if since:
            try:
                since_t = datetime.fromisoformat(since).replace(tzinfo=UTC).timestamp()
            except ValueError:
                since_t = None
        rows = _runs(root or None, verdict or None, cause or None, since_t, 10000)
        causes = [r["cause"] for r in svc.db.all("SELECT DISTINCT cause FROM runs WHERE cause IS NOT NULL")]
        return page(request, "runs.html.j2", runs=rows, roots=[str(r) for r in cfg.roots], verdicts=_VERDICTS,
                    causes=causes, f={"root": root, "verdict": verdict, "cause": cause, "since": since}, title="Runs")

    @app.get("/runs/{run_id}", include_in_schema=False, response_class=HTMLResponse)
    def ui_run(request: Request, run_id: int) -> HTMLResponse:
        r = _run_or_404(run_id)
        body = None
        if r["analysis_id"]:
            a = svc.db.one("SELECT body FROM analyses WHERE id=?", (r["analysis_id"],))
            body = json.loads(a["body"]) if a else None
        history = svc.db.all("SELECT id, at, verdict, cause, onset_step, last_step FROM analyses WHERE run_id=? "
                             "ORDER BY id DESC LIMIT 50", (run_id,))
        return page(request, "run.html.j2", run=r, analysis=body, incidents=inc.listing(svc.db, run_id=run_id),
                    history=history, title=r["name"])

    @app.get("/compare", include_in_schema=False, response_class=HTMLResponse)
    def ui_compare(request: Request, a: int | None = None, b: int | None = None) -> HTMLResponse:
        runs = svc.db.all("SELECT id, name, verdict FROM runs ORDER BY name")
        return page(request, "compare.html.j2", runs=runs, a=a, b=b, title="Compare")

    @app.get("/audit", include_in_schema=False, response_class=HTMLResponse)
    def ui_audit(request: Request) -> HTMLResponse:
        days = svc.db.all(
            "SELECT date(at, 'unixepoch') AS day, COUNT(*) AS analyses, COUNT(DISTINCT run_id) AS runs, "
            "SUM(verdict = 'anomaly') AS anomalies, SUM(verdict = 'healthy') AS healthy FROM analyses "
            "GROUP BY day ORDER BY day DESC LIMIT 90")
        opened = svc.db.all("SELECT date(opened_at, 'unixepoch') AS day, COALESCE(cause, kind) AS cause, COUNT(*) AS n "
                            "FROM incidents GROUP BY day, cause ORDER BY day DESC, n DESC")
        verdicts = svc.db.all("SELECT COALESCE(verdict, 'pending') AS verdict, COUNT(*) AS n FROM runs GROUP BY 1 "
                              "ORDER BY n DESC")
        causes = svc.db.all("SELECT cause, COUNT(*) AS n FROM runs WHERE cause IS NOT NULL GROUP BY cause "
                            "ORDER BY n DESC")
        return page(request, "audit.html.j2", days=days, opened=opened, verdicts=verdicts, causes=causes,
                    groups=inc.recurring(svc.db), title="Audit")

    @app.post("/login", include_in_schema=False, response_class=HTMLResponse)
    async def ui_login_form(request: Request) -> Response:
        raw = await request.body()
        form = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        return ui_login(request, form.get("token", ""))

    @app.get("/login", include_in_schema=False, response_class=HTMLResponse)
    def ui_login(request: Request, token: str | None = None) -> Response:
        if token is not None:
            if not hmac.compare_digest(token, cfg.token or ""):
                return page(request, "login.html.j2", error="wrong token", title="Log in")
            resp = RedirectResponse("/", status_code=303)
            resp.set_cookie(COOKIE, session, httponly=True, samesite="strict", secure=False)
            return resp
        return page(request, "login.html.j2", error="", title="Log in")

    @app.post("/ui/incidents/{incident_id}/{action}", include_in_schema=False)
    async def ui_set(request: Request, incident_id: int, action: str) -> Response:
        if not _session_ok(request):
            raise HTTPException(401, "log in first (/login)")
        raw = await request.body()
        form = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        if not hmac.compare_digest(str(form.get("csrf", "")), csrf):
            raise HTTPException(403, "bad form token")
        if action not in ("ack", "resolve"):
            raise HTTPException(404, "unknown action")
        await asyncio.to_thread(_set, incident_id, "acked" if action == "ack" else "resolved")
        back = str(form.get("back", "/"))
        return RedirectResponse(back if back.startswith("/") and not back.startswith("//") else "/", status_code=303)

    wrapped = BodyLimit(app, cfg.max_body_bytes)
    wrapped.state = app.state  # type: ignore[attr-defined]
    wrapped.fastapi = app  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]
