"""The incidents API: list, groups of recurring incidents, one incident, acknowledge and resolve."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from forensics.service import incidents as inc
from forensics.service._http import Http, incident_obj


def incidents_router(http: Http) -> APIRouter:
    """The ``/api/incidents`` routes (writes need the bearer token)."""
    router = APIRouter(tags=["incidents"])
    db = http.svc.db

    @router.get("/api/incidents")
    def list_incidents(status: str | None = Query(None, pattern="^(open|acked|resolved)$"),
                       run: int | None = None, group: str | None = None,
                       limit: int = Query(500, ge=1, le=10000)) -> list[dict[str, Any]]:
        """Incidents, newest first."""
        return [incident_obj(i) for i in inc.listing(db, status, run, group, limit)]

    @router.get("/api/incidents/groups")
    def incident_groups() -> list[dict[str, Any]]:
        """Recurring incidents: groups (cause + node/shard when known) seen in two or more runs."""
        return inc.recurring(db)

    @router.get("/api/incidents/{incident_id}")
    def get_incident(incident_id: int) -> dict[str, Any]:
        """One incident."""
        i = inc.get(db, incident_id)
        if i is None:
            raise HTTPException(404, f"no incident {incident_id}")
        return incident_obj(i)

    @router.post("/api/incidents/{incident_id}/ack", dependencies=[Depends(http.require_write)])
    def ack(incident_id: int) -> dict[str, Any]:
        """Acknowledge an incident (needs the bearer token)."""
        return http.set_status(incident_id, "acked")

    @router.post("/api/incidents/{incident_id}/resolve", dependencies=[Depends(http.require_write)])
    def resolve(incident_id: int) -> dict[str, Any]:
        """Resolve an incident (needs the bearer token)."""
        return http.set_status(incident_id, "resolved")

    return router
