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

import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from forensics.service._http import Http
from forensics.service.routes_incidents import incidents_router
from forensics.service.routes_runs import jobs_router, runs_router
from forensics.service.routes_ui import pages_router, session_router
from forensics.service.scheduler import Service, ServiceConfig

_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; frame-src 'self'; frame-ancestors 'self'; form-action 'self'; base-uri 'none'")


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


def _service_routes(app: FastAPI, http: Http) -> None:
    """``/healthz`` and ``/metrics``, and the guard every request passes (token on a non-loopback bind)."""
    svc, cfg = http.svc, http.cfg

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if (not cfg.loopback and path not in ("/healthz", "/login") and not http.bearer_ok(request)
                and not http.session_ok(request)):
            return JSONResponse({"detail": "a bearer token is required on this bind"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        resp = await call_next(request)
        resp.headers.setdefault("Content-Security-Policy", _CSP)
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("Referrer-Policy", "no-referrer")
        return resp

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, Any]:
        """Liveness: the service answers and its database is readable."""
        n = svc.db.one("SELECT COUNT(*) AS n FROM runs") or {"n": 0}
        return {"ok": True, "runs": n["n"], "analyses": svc.analyses_done, "uptime_s": time.time() - svc.started}

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus text format: runs by verdict, incidents open, analysis latency, watcher lag."""
        return Response(svc.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")


def create_app(cfg: ServiceConfig) -> FastAPI:
    """The ASGI application of one service (its lifespan starts workers, watcher and loops).

    The routes live one group per module: :mod:`~forensics.service.routes_runs` (runs, reports, analyse,
    compare), :mod:`~forensics.service.routes_incidents` and :mod:`~forensics.service.routes_ui` (pages,
    login); what they share is :class:`~forensics.service._http.Http`. The application is wrapped in
    :class:`BodyLimit` (its ``state`` and ``fastapi`` attributes reach the FastAPI app).
    """
    svc = Service(cfg)
    http = Http(svc, cfg)

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
    _service_routes(app, http)
    app.include_router(runs_router(http))
    app.include_router(jobs_router(http))
    app.include_router(incidents_router(http))
    app.include_router(pages_router(http))
    app.include_router(session_router(http))
    wrapped = BodyLimit(app, cfg.max_body_bytes)
    wrapped.state = app.state  # type: ignore[attr-defined]
    wrapped.fastapi = app  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]
