"""What every route group of the service shares: the service, its settings, auth checks and JSON shapes.

One :class:`Http` per application, built by :func:`forensics.service.app.create_app` and handed to the
route modules (:mod:`~forensics.service.routes_runs`, :mod:`~forensics.service.routes_incidents`,
:mod:`~forensics.service.routes_ui`).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

import reports
from forensics.model import Verdict
from forensics.service import incidents as inc
from forensics.service.scheduler import Service, ServiceConfig

TEMPLATES = Path(reports.__file__).resolve().parent / "templates" / "service"
COOKIE = "forensics_session"
UNREADABLE = "unreadable"
"""The verdict column and error kind of a run whose analysis failed (not a :class:`~forensics.model.Verdict`)."""
VERDICTS = (*(str(v) for v in Verdict), UNREADABLE)
"""What the runs page can filter on."""


def _shown(value: Any) -> Any:
    """Text from run folders, before autoescape: bidi and control characters made visible (issue 16)."""
    from markupsafe import Markup

    from reports.escape import html_text

    return html_text(value) if isinstance(value, str) and not isinstance(value, Markup) else value


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, finalize=_shown)
    env.filters["ts"] = lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t else ""
    return env


def run_obj(r: dict[str, Any]) -> dict[str, Any]:
    """The JSON shape of one ``runs`` row, with the links of its analysis, reports and page."""
    onset = {"step": r["onset_step"], "segment": r["onset_segment"]} if r.get("onset_step") is not None else None
    return {"id": r["id"], "path": r["path"], "name": r["name"], "root": r["root"], "verdict": r["verdict"],
            "cause": r["cause"], "mechanism": r["mechanism"], "onset": onset, "last_step": r["last_step"],
            "last_analyzed": r["last_analyzed"], "analysis_id": r["analysis_id"], "error": r["error"],
            "links": {"analysis": f"/api/runs/{r['id']}/analysis", "report_html": f"/api/runs/{r['id']}/report.html",
                      "report_md": f"/api/runs/{r['id']}/report.md", "page": f"/runs/{r['id']}"}}


def incident_obj(i: dict[str, Any]) -> dict[str, Any]:
    """The JSON shape of one incident."""
    keys = ("id", "fingerprint", "run_id", "run_path", "run_name", "kind", "cause", "mechanism", "onset_step",
            "onset_segment", "onset_latest", "seen_step", "summary", "opened_at", "status", "acked_at",
            "resolved_at", "group_key", "group_runs", "node", "shard", "analyses")
    return {k: i.get(k) for k in keys}


@dataclass
class Http:
    """The service behind the routes, with its token-derived session and CSRF values and page templates."""

    svc: Service
    cfg: ServiceConfig
    env: Environment = field(default_factory=_env)

    def __post_init__(self) -> None:
        """Derive the session cookie and the CSRF field from the token (HMAC-SHA256)."""
        self.token = self.cfg.token or ""
        self.session = hmac.new(self.token.encode(), b"session", hashlib.sha256).hexdigest()
        self.csrf = hmac.new(self.token.encode(), b"csrf", hashlib.sha256).hexdigest()

    def bearer_ok(self, request: Request) -> bool:
        """Whether the request carries ``Authorization: Bearer TOKEN``."""
        h = request.headers.get("authorization", "")
        return h.startswith("Bearer ") and hmac.compare_digest(h[7:].strip(), self.token)

    def session_ok(self, request: Request) -> bool:
        """Whether the request carries the session cookie set by ``/login``."""
        return hmac.compare_digest(request.cookies.get(COOKIE, ""), self.session)

    def require_write(self, request: Request) -> None:
        """FastAPI dependency of every write: 401 without the bearer token."""
        if not self.bearer_ok(request):
            raise HTTPException(401, "a bearer token is required (Authorization: Bearer TOKEN)",
                                headers={"WWW-Authenticate": "Bearer"})

    def run_or_404(self, run_id: int) -> dict[str, Any]:
        """The ``runs`` row of ``run_id``; 404 when there is none."""
        r = self.svc.db.one("SELECT * FROM runs WHERE id = ?", (run_id,))
        if r is None:
            raise HTTPException(404, f"no run {run_id}")
        return r

    def runs(self, root: str | None, verdict: str | None, cause: str | None, since: float | None,
             limit: int) -> list[dict[str, Any]]:
        """``runs`` rows filtered by root, verdict, cause and last analysis time, by name."""
        where, args = [], []
        for col, val in (("root", root), ("verdict", verdict), ("cause", cause)):
            if val:
                where.append(f"{col} = ?")
                args.append(val)
        if since is not None:
            where.append("last_analyzed >= ?")
            args.append(since)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY name LIMIT ?"
        return self.svc.db.all(sql, (*args, limit))

    def set_status(self, incident_id: int, status: str) -> dict[str, Any]:
        """Acknowledge or resolve an incident; 404 when there is none."""
        i = inc.set_status(self.svc.db, incident_id, status)
        if i is None:
            raise HTTPException(404, f"no incident {incident_id}")
        return incident_obj(i)

    def page(self, request: Request, name: str, **ctx: Any) -> HTMLResponse:
        """Render one UI template (autoescaped), with the login state and CSRF field."""
        ctx.setdefault("title", "train-forensics")
        logged_in = self.session_ok(request)
        html = self.env.get_template(name).render(logged_in=logged_in, csrf=self.csrf if logged_in else "",
                                                  nav=name, **ctx)
        return HTMLResponse(html)
