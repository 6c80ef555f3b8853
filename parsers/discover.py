"""Reading a run folder: walk and claim its files (:mod:`parsers.walk`), read each, assign global segments.

Files are claimed by :func:`parsers.walk.claim_files` (which parser reads each file; configs, notes;
what is never opened and why). Each claimed file is read by its parser into Arrow tables; the global
segment of each file's records comes from :mod:`parsers.segments` (groups of files, resumes that go
back, text logs as launches). The long metrics tables are turned into one polars frame column by
column, each Arrow column released once converted (memory stays about one table, whatever the run's
size); the run name and segment offset are added by polars, not per row in Python.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from forensics.errors import InputError, ParseError
from forensics.model import ParseResult, RunData, Skip, SourceInfo
from forensics.rundata import metrics_frame
from forensics.schema import EVENTS_SCHEMA, METRICS_SCHEMA, conform_metrics
from parsers import epoch_steps, file_policy, rank_files, safe_yaml
from parsers._io import DROPPED, MAX_LINE_BYTES, STEP_KEY
from parsers.segments import bounds, groups_of, offsets_of
from parsers.walk import (
    LFS_POINTER,
    NO_LOGS,
    PERMISSION_DENIED,
    check_root,
    claim_files,
    one_line,
    rel_path,
    with_skips,
)

__all__ = ["LFS_POINTER", "NO_LOGS", "PERMISSION_DENIED", "discover", "load_run"]

_MAX_CONFIG_BYTES = 1 << 20
_MAX_CONFIGS = 200


def discover(run_dir: str | Path) -> tuple[list[tuple[Path, Any]], list[Skip]]:
    """Find the files of a run folder that a parser recognises.

    Args:
        run_dir: The run folder.

    Returns:
        ``(claims, skipped)``: ``claims`` lists ``(path, parser module)`` in walk order (sorted,
        depth first); ``skipped`` names unclaimed log-like files ("no parser recognised the format"),
        folders that could not be listed, entries that are not regular files (FIFO, device, socket,
        dangling symlink: never opened), files without read permission ("permission denied: not
        read") and ``*.gz`` files that are not gzip data; none of these reaches a parser.
        Config files and non-log files are not in either.

    Raises:
        InputError: ``run_dir`` does not exist or is not a folder.
    """
    root = check_root(run_dir)
    with file_policy.scope(root):
        claims, skipped, _, _ = claim_files(root)
    return claims, skipped

def load_run(run_dir: str | Path, ignore: tuple[str, ...] = (), step_key: str | None = None, *,
             reader: Callable[[Path, Any, Path], ParseResult] | None = None) -> RunData:
    """Read every training log of a run folder into one :class:`RunData`.

    Args:
        run_dir: The run folder (a path to a folder, not a file).
        ignore: Glob patterns (relative to the run folder) of files not to read (``forensics.toml``);
            each file left out is listed in ``skipped``.
        step_key: The step column of tables, when the user named one (``forensics.toml``).
        reader: Reads one claimed file: ``reader(path, parser module, root) -> ParseResult``; the default
            is the module's own ``read(path, root)``. The service passes
            :meth:`parsers.incremental.IncrementalReader.read`, which re-reads only appended records.

    Returns:
        :class:`RunData` with ``metrics``/``events`` (polars; ``run`` = the folder name, ``segment``
        global within each source group), ``sources`` (one :class:`SourceInfo` per file read:
        ``records`` = metric rows, ``segments`` = distinct global segments), ``skipped`` (unclaimed
        log-like files, unreadable files, FIFOs/devices/dangling symlinks (never opened), ``*.gz``
        files that are not gzip data, damage inside files) and ``meta``: ``formats`` (sorted),
        ``config_files`` {relpath: parsed}, ``by_source`` {relpath: parser meta}, ``source_groups``
        {relpath: group key}, ``precision`` {relpath: precision}, ``hparams`` (merged),
        ``framework`` (first found) and ``parsers_unavailable`` when a parser could not be imported.

    Raises:
        InputError: The folder does not exist, is a file, is empty, or holds no training log.
    """
    root = check_root(run_dir)
    with file_policy.scope(root):
        claims, skipped, configs, unavailable = claim_files(root)
        if ignore:
            claims = _not_ignored(claims, root, ignore, skipped)
        token = STEP_KEY.set(step_key)
        try:
            results = _read_files(root, claims, skipped, reader)
        finally:
            STEP_KEY.reset(token)
        return _assemble(root, run_dir, results, skipped, configs, unavailable)


def _not_ignored(claims: list, root: Path, ignore: tuple[str, ...], skipped: list[Skip]) -> list:
    """The claims whose path matches none of the ``ignore`` globs; the others are listed as ignored."""
    kept = []
    for path, mod in claims:
        rel = rel_path(path, root)
        if any(PurePosixPath(rel).match(g) or fnmatch.fnmatch(rel, g) for g in ignore):
            skipped.append(Skip(rel, "ignored (forensics.toml: ignore)"))
        else:
            kept.append((path, mod))
    return kept


def _read_files(root: Path, claims: list, skipped: list[Skip],
                reader: Callable[[Path, Any, Path], ParseResult] | None) -> list[tuple[str, ParseResult, dict]]:
    """Read each claimed file: ``(rel, result, bounds)`` per file read; what failed goes to ``skipped``.

    Raises:
        InputError: No file could be read.
    """
    results: list[tuple[str, ParseResult, dict]] = []
    failures: list[Skip] = []
    for path, mod in claims:
        rel = rel_path(path, root)
        fmt = getattr(mod, "FORMAT", mod.__name__.rpartition(".")[2])
        dropped: list[tuple[str, int, int]] = []
        token = DROPPED.set(dropped)  # overlong lines the bounded reader dropped (parsers._io)
        try:
            pr = mod.read(path, root) if reader is None else reader(path, mod, root)
        except ParseError as exc:
            failures.append(Skip(rel, one_line(exc.message)))
            continue
        except Exception as exc:  # noqa: BLE001 - one bad file never stops the run
            failures.append(Skip(rel, one_line(f"the {fmt} parser failed: {type(exc).__name__}: {exc}")))
            continue
        finally:
            DROPPED.reset(token)
            skipped.extend(Skip(f"{rel}:{line}", f"line of {n} bytes (more than {MAX_LINE_BYTES}): not read")
                           for p, line, n in dict.fromkeys(dropped) if p == str(path))
        pr = epoch_steps.repair(pr)  # a step that restarts every epoch: one run, not restarts
        results.append((rel, pr, bounds(pr)))
        skipped.extend(pr.skipped)
    if not results:
        if failures:
            why = "; ".join(f"{s.what}: {s.reason}" for s in failures[:3])
            raise InputError(root, f"no readable training log ({len(failures)} found, none readable: {why})")
        raise InputError(root, with_skips(NO_LOGS, skipped))
    skipped.extend(failures)
    return results


def _assemble(root: Path, run_dir: str | Path, results: list[tuple[str, ParseResult, dict]], skipped: list[Skip],
              configs: list[Path], unavailable: dict[str, str]) -> RunData:
    """One :class:`RunData` from the files read; each result is released once its tables are converted."""
    results, rank_groups, rank_skips = rank_files.merge(results, bounds)  # per-rank files: ranks, not restarts
    skipped.extend(rank_skips)
    groups = {**groups_of(results), **rank_groups}
    continued: dict[str, tuple[int, int]] = {}
    offsets = offsets_of(results, groups, continued)
    run = file_policy.display(root.name)  # a folder name that is not UTF-8 is kept, escaped
    metrics: list[pl.DataFrame] = []
    events: list[pl.DataFrame] = []
    ranks: list[pa.Table] = []  # each rank's own values of the compared series (parsers.rank_files)
    sources: list[SourceInfo] = []
    meta: dict[str, Any] = {"run": run, "formats": sorted({pr.format for _, pr, _ in results}),
                            "config_files": {}, "by_source": {}, "source_groups": {}, "precision": {},
                            "hparams": {}}
    results.reverse()
    while results:  # popped, so that each file's Arrow tables are freed as soon as they are converted
        rel, pr, _ = results.pop()
        try:
            e = _with_run(pr.events, EVENTS_SCHEMA, run, offsets[rel])
            if rel in continued:
                e = pa.concat_tables([e, _restart_event(run, rel, offsets[rel], *continued[rel])])
            m = conform_metrics(pr.metrics)  # text columns may be dictionaries (a big file's reader)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
            skipped.append(Skip(rel, f"the {pr.format} parser returned a malformed table: {exc}"))
            continue
        fmt = pr.format
        if pr.ranks is not None and pr.ranks.num_rows:
            seg = pr.ranks.column("segment").to_numpy() + np.int32(offsets[rel])
            ranks.append(pr.ranks.set_column(1, "segment", pa.array(seg.astype(np.int32))))
        _source_meta(meta, rel, pr, groups[rel])
        del pr
        m = metrics_frame(m, run, offsets[rel])  # compact: categorical text, run held once
        metrics.append(m)
        events.append(pl.from_arrow(e))
        seg = m.get_column("segment")
        segs = (1 if not seg.null_count() and seg.min() == seg.max() else seg.n_unique()) if m.height else 0
        sources.append(SourceInfo(path=rel, format=fmt, records=m.height, segments=segs))
    _read_configs(root, configs, meta, skipped)
    if unavailable:
        meta["parsers_unavailable"] = unavailable
    mt = (pl.concat(metrics, how="vertical", rechunk=False) if metrics
          else metrics_frame(METRICS_SCHEMA.empty_table(), run))
    et = pl.concat(events, how="vertical") if events else pl.from_arrow(EVENTS_SCHEMA.empty_table())
    tensors, updates = _read_checkpoints(root, run, meta, skipped)
    named = str(run_dir) if Path(run_dir).name not in ("", ".", "..") else str(root)  # `analyze .`: its path
    return RunData(run=named, metrics=mt, events=et, meta=meta,
                   sources=sources, skipped=skipped, tensors=tensors, updates=updates,
                   ranks=pl.from_arrow(pa.concat_tables(ranks)) if ranks else pl.DataFrame())


def _source_meta(meta: dict[str, Any], rel: str, pr: ParseResult, group: str) -> None:
    """What the run meta keeps of one file's result."""
    meta["by_source"][rel] = _jsonable(dict(pr.meta))
    meta["source_groups"][rel] = group
    meta["precision"][rel] = pr.precision
    if isinstance(pr.meta.get("hparams"), dict):
        meta["hparams"].update(pr.meta["hparams"])
    if pr.meta.get("framework") and "framework" not in meta:
        meta["framework"] = pr.meta["framework"]


def _checked(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` with the columns of ``schema`` in its order and types (no copy when they already match).

    Raises:
        KeyError, pyarrow.ArrowInvalid, pyarrow.ArrowTypeError: ``t`` lacks a column or a type does not cast.
    """
    t = t.select(schema.names)
    return t if t.schema.equals(schema) else t.cast(schema)


def _with_run(t: pa.Table, schema: pa.Schema, run: str, offset: int) -> pa.Table:
    """An events table with ``run`` set and ``offset`` added to its local segments (Arrow)."""
    t = _checked(t, schema)
    t = t.set_column(0, schema.field("run"), pa.repeat(_scalar(run), t.num_rows))
    seg = pc.add(t.column("segment").cast(pa.int64()), _scalar(offset)).cast(pa.int32())
    return t.set_column(t.schema.get_field_index("segment"), schema.field("segment"), seg)


def _scalar(value: str | int) -> pa.Scalar:
    """``value`` as an Arrow string or int64 scalar without ``pa.scalar`` (its conversion imports pandas, ~0.2 s)."""
    if isinstance(value, str):
        data = value.encode("utf-8")
        offsets = pa.py_buffer(np.array([0, len(data)], np.int32))
        return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])[0]
    return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(np.array([value], np.int64))])[0]


def _restart_event(run: str, rel: str, segment: int, last: int, first: int) -> pa.Table:
    """The ``restart`` event of a log file that continues the previous one's steps (a new launch)."""
    return pa.table({
        "run": [run], "segment": pa.array([segment], pa.int32()), "step": pa.array([first], pa.int64()),
        "kind": ["restart"], "message": [f"{rel}: a new log file (a new launch) continues at step {first} "
                                         f"after step {last} of the previous file"],
        "source": [rel]}, schema=EVENTS_SCHEMA)


def _read_configs(root: Path, configs: list[Path], meta: dict[str, Any], skipped: list[Skip]) -> None:
    """Config files into ``meta["config_files"]``, markdown notes into ``meta["notes"]``."""
    for path in configs[:_MAX_CONFIGS]:
        rel = rel_path(path, root)
        try:
            if path.suffix.lower() in (".md", ".markdown"):
                if path.stat().st_size <= _MAX_CONFIG_BYTES:
                    meta.setdefault("notes", {})[rel] = file_policy.no_surrogates(
                        file_policy.read_text(path, _MAX_CONFIG_BYTES, encoding="utf-8"))
                continue
            meta["config_files"][rel] = _load_config(path)
        except safe_yaml.TooLarge as exc:
            skipped.append(Skip(rel, f"config file not loaded: YAML {exc}"))
        except OSError as exc:
            skipped.append(Skip(rel, f"config file not read: {exc.strerror or exc}"))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {file_policy.no_surrogates(str(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, str):
        return file_policy.no_surrogates(obj)
    if obj is None or isinstance(obj, (int, float, bool)):
        return obj
    return file_policy.no_surrogates(str(obj))


def _load_config(path: Path) -> Any:
    """A config file as parsed data (YAML via :func:`parsers.safe_yaml.load`, JSON via ``json``), else its raw text.

    Raises:
        OSError: The file-access policy refuses it, or it cannot be read.
        parsers.safe_yaml.TooLarge: It expands past the node limit (a YAML alias bomb).
    """
    size = path.stat().st_size
    if size > _MAX_CONFIG_BYTES:
        return f"<not loaded: {size} bytes>"
    text = file_policy.read_text(path, _MAX_CONFIG_BYTES, encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            return _jsonable(json.loads(text))
        return _jsonable(safe_yaml.load(text))
    except safe_yaml.TooLarge:
        raise
    except Exception:  # noqa: BLE001 - a config that does not parse is kept as text
        return text


def _read_checkpoints(root: Path, run: str, meta: dict[str, Any], skipped: list[Skip]) -> tuple[Any, Any]:
    """The ``tensors``/``updates`` tables of the run's checkpoints (empty, after a walk of names, when none)."""
    from parsers.checkpoints import read_checkpoints

    try:
        tensors, updates, ck_meta, ck_skipped = read_checkpoints(root, run)
    except Exception as exc:  # noqa: BLE001 - a checkpoint reader bug never stops the log analysis
        skipped.append(Skip("checkpoints", one_line(f"checkpoint reader failed: {type(exc).__name__}: {exc}")))
        return pl.DataFrame(), pl.DataFrame()
    skipped.extend(ck_skipped)
    if ck_meta:
        meta["checkpoints"] = ck_meta
    return tensors, updates
