"""The service commands of ``forensics``: ``serve`` (watch roots, alert, serve API/UI) and ``watch`` (one live run).

Registered on the main group by :mod:`forensics.cli`; the service itself is imported only when a command runs.
"""

from __future__ import annotations

import socket
import sqlite3
import sys
from pathlib import Path

import click

from forensics.cli_common import errors as _errors
from forensics.cli_common import fail as _fail


def _check_port(host: str, port: int) -> None:
    """Exit 2 with one line naming ``host:port`` when it cannot be listened on (before announcing the service)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind((host, port))
    except OSError as exc:
        _fail(f"{host}:{port}: cannot listen there: {exc.strerror or exc} (another server? try --port)")


@click.command()
@click.argument("roots", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (non-loopback needs --token).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--db", type=click.Path(path_type=Path, dir_okay=False), default=Path("forensics-service.db"),
              show_default=True, help="SQLite database (created and migrated on start).")
@click.option("--webhook", "hooks", multiple=True, help="POST each new incident here (slack:URL for a Slack body).")
@click.option("--token", envvar="FORENSICS_TOKEN", default=None,
              help="Bearer token for writes (and for everything on a non-loopback bind); env FORENSICS_TOKEN.")
@click.option("--public-url", default=None, help="Base URL used in webhook links (default http://HOST:PORT).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="Analysis processes.")
@click.option("--analysis-timeout", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds one analysis or report may take.")
@click.option("--analysis-memory", default="8GiB", show_default=True,
              help="Memory one analysis worker may hold (e.g. 4GiB); past it the run becomes an unreadable incident.")
@click.option("--rescan", type=click.FloatRange(min=0.2), default=30.0, show_default=True,
              help="Seconds between full rescans of the roots (network filesystems).")
@click.option("--no-events", is_flag=True, help="Rescans only (no filesystem events).")
@click.option("--unreadable-grace", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds a new run may stay unreadable before it is an incident.")
@click.option("--settle", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds without a change after which a run's alerts are final (no onset confirmation).")
def serve(roots: tuple[Path, ...], host: str, port: int, db: Path, hooks: tuple[str, ...], token: str | None,
          public_url: str | None, workers: int, analysis_timeout: float, analysis_memory: str, rescan: float,
          no_events: bool, unreadable_grace: float, settle: float) -> None:
    """Watch ROOT... for runs, alert at the onset, keep every incident, serve API, UI and reports."""
    from forensics.run_limits import parse_bytes

    try:
        memory = parse_bytes(analysis_memory)
    except ValueError:
        raise click.BadParameter(f"not a size: {analysis_memory!r}", param_hint="--analysis-memory") from None
    with _errors(roots[0]):
        import uvicorn

        from forensics.service.app import create_app
        from forensics.service.scheduler import ServiceConfig

        cfg = ServiceConfig(roots=list(roots), host=host, port=port, db=db, webhooks=list(hooks), token=token,
                            base_url=public_url, workers=workers, analysis_timeout_s=analysis_timeout,
                            analysis_memory=memory, rescan_s=rescan, events=not no_events,
                            unreadable_grace_s=unreadable_grace, settle_s=settle)
        if not cfg.loopback and token is None:
            _fail(f"{host}: a non-loopback bind needs --token (or FORENSICS_TOKEN)")
        _check_port(host, port)
        try:
            app = create_app(cfg)
        except sqlite3.DatabaseError as exc:  # a corrupt or foreign --db: its path, not the root's
            _fail(f"{db}: cannot open the service database: {exc}")
        click.echo(f"forensics serve: {', '.join(str(r) for r in cfg.roots)} on {cfg.base_url} (db {db})", err=True)
        if cfg.token_generated:
            click.echo(f"write token (this start only): {cfg.token}  UI login: {cfg.base_url}/login", err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between looks at the logs.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=300.0, show_default=True,
              help="The run has ended when no new record arrived for this long.")
@click.option("--final-step", type=click.IntRange(min=1), default=None,
              help="The run has ended at this step (default: from its config: max_steps, steps, ...).")
@click.option("--webhook", "hooks", multiple=True, help="POST each alert here (slack:URL for a Slack body).")
def watch(run_dir: Path, interval: float, idle_timeout: float, final_step: int | None, hooks: tuple[str, ...]) -> None:
    """Follow one live run: print the first alert with its onset; exit 1 on an anomaly, 0 when it ends healthy."""
    with _errors(run_dir):
        from forensics.service.live import watch as follow

        if not run_dir.is_dir():
            _fail(f"{run_dir}: not a directory (give the run folder)")
        code = follow(run_dir, interval_s=interval, idle_timeout_s=idle_timeout, final_step=final_step,
                      hooks=hooks, echo=lambda s: click.echo(s, err=not s.startswith("ALERT")))
    sys.exit(code)
