"""The service end to end: a real server, an httpx client, a webhook receiver, a real browser.

``forensics serve`` runs on loopback (uvicorn, in a subprocess); the webhook receiver is a real HTTP
server on loopback; the browser is Playwright driving the Debian Chromium.

A faulty sample run (``data_batch``: a fully padded batch at step 250) is replayed step by step into a
temporary root while the service watches it; a healthy one beside it. The tests run in file order
on one server; the last one restarts it on the same database.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_helpers import SAMPLES, Receiver, Server, wait_for

from forensics.service.replay import replay

pytestmark = pytest.mark.skipif(not (SAMPLES / "data_batch").is_dir(), reason="sample runs missing")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The server, its root with a replayed faulty run, a healthy run, a broken run, a symlink out, receivers."""
    base = tmp_path_factory.mktemp("service")
    root = base / "root"
    root.mkdir()
    outside = base / "outside"
    shutil.copytree(SAMPLES / "healthy", outside / "healthy_outside")
    (outside / "healthy_outside" / "expected.json").unlink()
    os.symlink(outside / "healthy_outside", root / "linked_out")  # a symlink out of the root: never a run
    bad = root / "broken_run"
    bad.mkdir()
    (bad / "events.out.tfevents.1.host").write_bytes(b"\x07garbage that is no TFRecord" * 3)
    hook, slack = Receiver(fail_first=1), Receiver()
    srv = Server([root], base / "svc.db", hooks=(hook.url, "slack:" + slack.url),
                 extra=("--workers", "1", "--rescan", "1", "--unreadable-grace", "0"))
    state = {"base": base, "root": root, "outside": outside, "hook": hook, "slack": slack, "srv": srv}
    shutil.copytree(SAMPLES / "healthy", root / "healthy", ignore=shutil.ignore_patterns("expected.json"))
    wait_for(lambda: _runs(srv).get("healthy", {}).get("verdict"), timeout=60, what="the first analysis")
    t = threading.Thread(target=replay, args=(SAMPLES / "data_batch", root / "data_batch"),
                         kwargs={"steps_per_tick": 10, "tick_s": 0.15})
    t.start()
    t.join()
    yield state
    state["srv"].stop()
    hook.close()
    slack.close()


def _runs(srv: Server) -> dict[str, dict]:
    """The server, its root with a replayed faulty run, a healthy run, a broken run, a symlink out, receivers."""
    return {r["name"].rpartition("/")[2]: r for r in srv.client.get("/api/runs").json()}


def _settled(srv: Server) -> dict[str, dict]:
    def done() -> dict | None:
        runs = _runs(srv)
        ok = (runs.get("data_batch", {}).get("last_step") == 250 and runs.get("healthy", {}).get("verdict")
              and runs.get("broken_run", {}).get("error"))
        return runs if ok else None
    return wait_for(done, timeout=60, what="the replayed run, the healthy run and the broken run analysed")


def test_incident_opens_once_with_cause_and_onset(env: dict) -> None:
    """The live faulty run opens one incident with the right cause and onset; healthy opens none."""
    srv = env["srv"]
    runs = _settled(srv)
    assert runs["data_batch"]["verdict"] == "anomaly" and runs["data_batch"]["cause"] == "data_batch"
    assert runs["data_batch"]["onset"] == {"step": 250, "segment": 0}
    assert runs["healthy"]["verdict"] == "healthy"
    assert "linked_out" not in runs and "healthy_outside" not in runs
    history = srv.client.get(f"/api/runs/{runs['data_batch']['id']}/analyses").json()
    assert len(history) >= 2, "the live run was analysed more than once while it grew"
    incidents = srv.client.get("/api/incidents").json()
    mine = [i for i in incidents if i["run_id"] == runs["data_batch"]["id"]]
    assert len(mine) == 1, mine
    assert (mine[0]["kind"], mine[0]["cause"], mine[0]["onset_step"]) == ("anomaly", "data_batch", 250)
    assert not [i for i in incidents if i["run_id"] == runs["healthy"]["id"]]
    analysis = srv.client.get(f"/api/runs/{runs['data_batch']['id']}/analysis").json()
    assert analysis["verdict"] == "anomaly" and analysis["onset"]["step"] == 250 and "findings" in analysis
    md = srv.client.get(f"/api/runs/{runs['data_batch']['id']}/report.md")
    assert md.status_code == 200 and "data_batch" in md.text


def test_unreadable_run_is_an_incident(env: dict) -> None:
    """A run no parser can read is an ``unreadable`` incident and an error contract, not a crash."""
    srv = env["srv"]
    runs = _settled(srv)
    broken = [i for i in srv.client.get("/api/incidents").json() if i["run_id"] == runs["broken_run"]["id"]]
    assert len(broken) == 1 and broken[0]["kind"] == "unreadable", broken
    r = srv.client.get(f"/api/runs/{runs['broken_run']['id']}/analysis")
    assert r.status_code == 422 and r.json()["error"]["kind"] == "unreadable"
    assert srv.client.get("/healthz").json()["ok"]


def test_webhook_gets_one_body_per_incident(env: dict) -> None:
    """Each receiver gets exactly one body per incident, after a retry of a 500."""
    srv, hook, slack = env["srv"], env["hook"], env["slack"]
    _settled(srv)
    n_incidents = len(srv.client.get("/api/incidents").json())
    wait_for(lambda: len(hook.bodies) >= n_incidents and len(slack.bodies) >= n_incidents, timeout=30,
             what="the webhook bodies (the first attempt is answered 500, so a retry is needed)")
    assert hook.attempts >= len(hook.bodies) + 1  # the 500 was retried
    fps = [b["incident"]["fingerprint"] for b in hook.bodies]
    assert len(fps) == len(set(fps)) == n_incidents
    db_body = next(b for b in hook.bodies if b["incident"]["cause"] == "data_batch")
    assert db_body["analysis"]["verdict"] == "anomaly" and db_body["analysis"]["onset"]["step"] == 250
    assert db_body["link"].startswith(srv.url + "/runs/")
    assert all("text" in b and "blocks" in b for b in slack.bodies) and len(slack.bodies) == n_incidents
    assert any("data_batch" in b["text"] and "step 250" in b["text"] for b in slack.bodies)


def test_refusals(env: dict) -> None:
    """Missing or wrong token, paths outside the roots, '..', a symlink out and a huge body are refused."""
    srv, outside = env["srv"], env["outside"]
    c = srv.client
    assert c.post("/api/incidents/1/ack").status_code == 401                                     # no token
    assert c.post("/api/incidents/1/ack", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert c.post("/api/analyze", json={"path": "data_batch"}).status_code == 401
    assert c.post("/api/analyze", json={"path": str(outside / "healthy_outside")}, headers=srv.auth).status_code == 403
    assert c.post("/api/analyze", json={"path": "data_batch/../../outside"}, headers=srv.auth).status_code == 403
    assert c.post("/api/analyze", json={"path": "linked_out"}, headers=srv.auth).status_code == 403  # symlink out
    big = {"path": "x" * 200_000}
    assert c.post("/api/analyze", json=big, headers=srv.auth).status_code == 413
    ok = c.post("/api/analyze", json={"path": "healthy"}, headers=srv.auth)
    assert ok.status_code == 200 and ok.json()["analysis"]["verdict"] == "healthy"


def test_metrics_parse(env: dict) -> None:
    """``/metrics`` parses with prometheus_client's parser; OpenAPI lists the API."""
    srv = env["srv"]
    _settled(srv)
    text = srv.client.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    runs = {s.labels["verdict"]: s.value for s in fams["forensics_runs"].samples}
    assert runs.get("anomaly", 0) >= 1 and runs.get("healthy", 0) >= 1
    assert sum(s.value for s in fams["forensics_incidents_open"].samples) >= 2
    assert any(s.name == "forensics_analysis_seconds_count" and s.value > 0 for s in fams["forensics_analysis_seconds"]
               .samples)
    assert "forensics_watcher_lag_seconds" in fams
    assert srv.client.get("/openapi.json").json()["paths"].keys() >= {
        "/api/runs", "/api/runs/{run_id}/analysis", "/api/runs/{run_id}/report.html", "/api/runs/{run_id}/report.md",
        "/api/incidents", "/api/incidents/{incident_id}/ack", "/api/incidents/{incident_id}/resolve", "/api/analyze",
        "/healthz", "/metrics"}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs Debian's chromium)")
def test_ui_shows_incident_and_ack_works(env: dict) -> None:
    """The incidents page shows the incident; after logging in, the Ack button acknowledges it."""
    playwright = pytest.importorskip("playwright.sync_api")
    srv = env["srv"]
    runs = _settled(srv)
    inc = next(i for i in srv.client.get("/api/incidents").json() if i["run_id"] == runs["data_batch"]["id"])
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_FLAGS)
        try:
            page = browser.new_page()
            page.goto(srv.url + "/")
            row = page.locator(f"#incident-{inc['id']}")
            assert "data_batch" in row.inner_text() and "250" in row.inner_text()
            assert page.locator(f"#ack-{inc['id']}").count() == 0  # not logged in: no write buttons
            page.goto(srv.url + "/login")
            page.fill("input[name=token]", srv.token)
            page.click("button[type=submit]")
            page.wait_for_url(srv.url + "/")
            page.click(f"#ack-{inc['id']}")
            page.wait_for_load_state()
            assert "acked" in page.locator(f"#incident-{inc['id']}").inner_text()
            page.goto(srv.url + f"/runs/{runs['data_batch']['id']}")
            assert "anomaly" in page.locator("#verdict").inner_text()
            page.goto(srv.url + "/runs?verdict=healthy")
            table = page.locator("#runs").inner_text()
            assert "healthy" in table and "data_batch" not in table
        finally:
            browser.close()
    assert srv.client.get(f"/api/incidents/{inc['id']}").json()["status"] == "acked"


def test_compare_two_runs(env: dict) -> None:
    """The compare page serves ``forensics compare``'s report of two runs."""
    srv = env["srv"]
    runs = _settled(srv)
    r = srv.client.get("/api/compare.html", params={"a": runs["healthy"]["id"], "b": runs["data_batch"]["id"]})
    assert r.status_code == 200 and "<html" in r.text.lower() and "data_batch" in r.text
    page = srv.client.get("/compare", params={"a": runs["healthy"]["id"], "b": runs["data_batch"]["id"]}).text
    assert "/api/compare.html?a=" in page


def test_escaped_rendering(env: dict, tmp_path: Path) -> None:
    """A run name with markup is rendered escaped."""
    srv, root = env["srv"], env["root"]
    evil = root / "<script>alert(1)<"
    shutil.copytree(SAMPLES / "healthy", evil, ignore=shutil.ignore_patterns("expected.json", "events.*"))
    r = srv.client.post("/api/analyze", json={"path": evil.name}, headers=srv.auth)
    assert r.status_code == 200
    page = srv.client.get("/runs").text
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_restart_keeps_state_and_sends_nothing_twice(env: dict) -> None:
    """After a restart on the same database: same incidents, same acks, nothing sent again."""
    srv, hook, slack = env["srv"], env["hook"], env["slack"]
    before = srv.client.get("/api/incidents").json()
    wait_for(lambda: len(hook.bodies) >= len(before), timeout=30, what="deliveries before the restart")
    sent = len(hook.bodies), len(slack.bodies)
    rid = _runs(srv)["data_batch"]["id"]
    analyses = len(srv.client.get(f"/api/runs/{rid}/analyses").json())
    srv.stop()
    srv2 = Server([env["root"]], env["base"] / "svc.db", hooks=(hook.url, "slack:" + slack.url),
                  extra=("--workers", "1", "--rescan", "1", "--unreadable-grace", "0"))
    env["srv"] = srv2
    wait_for(lambda: len(srv2.client.get(f"/api/runs/{rid}/analyses").json()) > analyses, timeout=40,
             what="a re-analysis after the restart")
    after = srv2.client.get("/api/incidents").json()
    assert [(i["id"], i["fingerprint"]) for i in after] == [(i["id"], i["fingerprint"]) for i in before]
    acked = [i for i in after if i["status"] == "acked"]
    assert len(acked) == len([i for i in before if i["status"] == "acked"])
    import time

    time.sleep(1.5)  # more than one delivery poll
    assert (len(hook.bodies), len(slack.bodies)) == sent
