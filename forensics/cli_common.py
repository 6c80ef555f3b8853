"""What every ``forensics`` command shares: exit codes, formats, the one error handler, where a report goes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from forensics import atomic
from forensics.errors import ForensicsError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
EXIT_INCONCLUSIVE = 3
"""The verdict is ``inconclusive``: the training objective was not found (not an error, not healthy)."""

FORMATS = ("html", "json", "markdown", "md", "text")  # md = markdown; every command takes all of them


def fail(message: str, *, json_error: tuple[str, object] | None = None) -> None:
    """One line on stderr and exit 2; with ``json_error=(kind, path)`` also one JSON object on stdout.

    The object is ``{"schema_version", "error": {"kind", "message", "path"}}`` (DESIGN.md section 7), so
    that ``-f json`` automation never parses an empty stdout.
    """
    from reports.escape import terminal_line

    click.echo(f"forensics: error: {terminal_line(str(message))}", err=True)  # one line, no escape sequence
    if json_error is not None:
        from forensics import SCHEMA_VERSION

        kind, path = json_error
        click.echo(json.dumps({"schema_version": SCHEMA_VERSION,
                               "error": {"kind": kind, "message": message, "path": str(path)}}))
    sys.exit(EXIT_ERROR)


@contextmanager
def errors(path: object, *, as_json: bool = False) -> Iterator[None]:
    """The one place errors become a one-line message and exit 2 (STYLE.md item 7).

    Project errors carry their path; OS errors get the file they name (or ``path``); anything
    else is an internal error, still one line (``FORENSICS_DEBUG=1`` re-raises it). With ``as_json``
    (``-f json``) the error is also printed as one JSON object on stdout; ``kind`` is ``input`` (a
    project error: the path cannot be read as a run), ``os`` or ``internal``.
    """
    try:
        yield
    except ForensicsError as exc:
        fail(str(exc), json_error=("input", exc.path or path) if as_json else None)
    except OSError as exc:
        where = getattr(exc, "filename", None) or path
        fail(f"{where}: {exc.strerror or exc}", json_error=("os", where) if as_json else None)
    except Exception as exc:  # noqa: BLE001 - never a traceback on the terminal
        if os.environ.get("FORENSICS_DEBUG"):
            raise
        fail(f"{path}: internal error {type(exc).__name__}: {exc} (set FORENSICS_DEBUG=1 for the traceback)",
              json_error=("internal", path) if as_json else None)


def shown(path: object) -> str:
    """A path as one safe terminal line (not-UTF-8 bytes escaped, control characters replaced)."""
    from parsers.file_policy import display
    from reports.escape import terminal_line

    return terminal_line(display(str(path)))


def metric_map(pairs: tuple[str, ...]) -> dict[str, str]:
    """``("loss=train/total",)`` -> ``{"loss": "train/total"}``; a malformed pair is a usage error."""
    from forensics.schema import CANONICAL_METRICS  # noqa: PLC0415 - keeps the CLI's start-up light

    out: dict[str, str] = {}
    for p in pairs:
        name, sep, column = p.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise click.BadParameter(f"{p!r}: expected NAME=COLUMN, e.g. loss=train/total_loss",
                                     param_hint="--metric")
        if name.strip() not in CANONICAL_METRICS:
            raise click.BadParameter(f"{p!r}: {name.strip()!r} is not a canonical metric; one of: "
                                     + ", ".join(CANONICAL_METRICS), param_hint="--metric")
        out[name.strip()] = column.strip()
    return out


def warn_unmatched(names: dict[str, object], mapping: dict[str, str]) -> None:
    """On stderr, one warning per ``--metric NAME=COLUMN`` whose column no input holds (the mapping is ignored)."""
    from forensics.objective import unmatched_mappings  # noqa: PLC0415 - keeps the CLI's start-up light

    for canon, raw in unmatched_mappings(names, mapping):
        click.echo(f"forensics: warning: --metric {canon}={raw}: no series named {raw!r} was found; "
                   "the mapping was not applied (`forensics ingest RUN -o OUT --explain` lists the names read)",
                   err=True)


def format_and_output(fmt: str, output: Path | None) -> tuple[str, Path | None]:
    """``md`` means ``markdown``; ``-o -`` means stdout."""
    return ("markdown" if fmt == "md" else fmt), (None if output is not None and str(output) == "-" else output)


def emit(payload: str, output: Path | None) -> None:
    """Write a report to ``output`` (folders created) or to stdout."""
    if output is None:
        click.echo(payload, nl=not payload.endswith("\n"))
        return
    atomic.write_text(output, payload)
    click.echo(f"report written to {shown(output)}", err=True)


def wants_json(argv: list[str]) -> bool:
    """True when a command line asks for ``-f json`` (any spelling click accepts)."""
    for i, a in enumerate(argv):
        if a in ("-f", "--format") and i + 1 < len(argv) and argv[i + 1] == "json":
            return True
        if a in ("-fjson", "--format=json"):
            return True
    return False


class JsonErrorGroup(click.Group):
    """A command group whose usage errors keep the ``-f json`` contract.

    A bad option value or an unreadable path argument with ``-f json`` gives one JSON error object on stdout
    beside the one-line message, exit 2 (DESIGN.md section 7); without it, click's usual usage text.
    """

    def main(self, args=None, prog_name=None, complete_var=None,  # noqa: ANN001, ANN201, D102
             standalone_mode=True, **extra):  # noqa: ANN001, ANN003
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            if wants_json(argv):
                fail(exc.format_message(), json_error=("usage", ""))
            exc.show()
            sys.exit(exc.exit_code)
