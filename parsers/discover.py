"""Discovery of a run folder: walk it, sniff each file, read it, assign global segments.

The parsers are the modules of :data:`parsers.PARSER_MODULES`, asked in order (the first whose
``sniff`` says yes reads the file; a module that is missing or fails to import is left out and named
in ``meta["parsers_unavailable"]``). Files nobody claims are listed in ``skipped`` only when they
look like logs; configuration files (``*.yaml``, ``config.json``, ``*_config.json``, ...) go to
``meta["config_files"]``; everything else (checkpoints, scripts, notes) is ignored silently. Files no
parser may read are always listed in ``skipped`` and never reach a parser: FIFOs, sockets, devices and
dangling symlinks (checked with ``os.stat``, never opened), files without read permission, ``*.gz``
files that are not gzip data.

Global segments: the files of one *group* are put in time order, and a file whose first step is at or
below the previous file's last step starts a new segment (a resume that went back); a file that continues
forward stays in the segment, except a text log: each stdout file is one launch, so a later one is a new
segment even when its steps continue (with a ``restart`` event naming the file boundary). A Git LFS
pointer file (the content never downloaded) is listed in ``skipped`` as one. Groups: TensorBoard files of
the whole run form chains of files that follow one another in time (``version_0``, ``version_1``, ... of
one job; writers running at the same time, like Keras ``train/`` and ``validation/``, are separate
chains); W&B transaction logs are grouped by run id (each ``offline-run-*`` folder of the run, a resume,
is a new segment); other formats are grouped by (format, folder). Each group numbers its segments from 0.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from forensics.errors import InputError, ParseError
from forensics.model import ParseResult, RunData, Skip, SourceInfo
from forensics.schema import EVENTS_SCHEMA, METRICS_SCHEMA
from parsers import PARSER_MODULES
from parsers._io import STEP_KEY, gzip_problem

LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".jsonl.gz", ".log.gz",
                ".txt.gz", ".out.gz", ".csv.gz")
"""Unclaimed files with these endings (or ``tfevents`` in the name) are reported as skipped."""
NO_LOGS = ("no training logs found (looked for TensorBoard event files, JSONL, trainer_state.json, "
           "CSV exports, trainer stdout)")
_CONFIG_JSON = {"config.json", "hparams.json", "args.json", "training_args.json", "params.json"}
_QUIET_JSON = re.compile(r"^(expected|tokenizer|special_tokens_map|vocab|added_tokens|preprocessor_config)"
                         r"\.json$|\.index\.json$|^wandb-metadata\.json$")
_QUIET_TXT = re.compile(r"^(requirements.*|license.*|readme.*|notice.*|vocab|merges|copying)\.txt$")
_LOG_HINT = re.compile(r"metric|log|histor|train|eval|state|summary|result|scalar|event|loss")
_KEEP_HIDDEN = {".hydra"}
_MAX_CONFIG_BYTES = 1 << 20
_MAX_CONFIGS = 200
_CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".distcp")  # parsers.checkpoints reads these
PERMISSION_DENIED = "permission denied: not read"


def _not_regular(path: Path) -> str | None:
    """Why a walked entry that is neither a folder nor a regular file is not read (None: it vanished).

    Uses ``os.stat``/``os.lstat`` only: a FIFO (opening blocks) or a device (``/dev/zero`` never
    ends) is never opened.
    """
    link = os.path.islink(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "dangling symlink: target missing" if link else None
    except PermissionError:
        return PERMISSION_DENIED
    except OSError as exc:
        if link:
            return f"symlink cannot be followed ({exc.strerror or exc}): not read"
        return f"cannot stat ({exc.strerror or exc}): not read"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "symlink to a device: not read" if link else "not a regular file (device): not read"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None  # changed while walking
    kind = "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "special file"
    return f"symlink to a {kind}: not read" if link else f"not a regular file ({kind}): not read"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _parsers() -> tuple[list[Any], dict[str, str]]:
    mods, unavailable = [], {}
    for name in PARSER_MODULES:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                unavailable[name] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a broken parser must not stop the others
            unavailable[name] = f"{type(exc).__name__}: {exc}"
    return mods, unavailable


def _check_root(run_dir: str | Path) -> Path:
    root = Path(run_dir).expanduser()
    if not root.exists():
        raise InputError(run_dir, "no such file or directory")
    if not root.is_dir():
        raise InputError(run_dir, "not a directory (give the run folder, not a file)")
    return root.resolve()


def _walk(root: Path, skipped: list[Skip]) -> list[Path]:
    """Every regular file under ``root``: sorted, depth first, hidden entries and symlink loops left out.

    Entries that are neither a folder nor a regular file (FIFO, socket, device, a symlink to one of
    these, a dangling symlink) are never opened; each is listed in ``skipped`` with the reason.
    """
    files, stack, seen = [], [root], set()
    while stack:
        folder = stack.pop()
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: _natural(e.name))
        except OSError as exc:
            where = folder.relative_to(root).as_posix() or "."
            skipped.append(Skip(where, f"cannot list folder: {exc.strerror or exc}"))
            continue
        subdirs = []
        for e in entries:
            if e.name.startswith(".") and e.name not in _KEEP_HIDDEN or e.name == "__pycache__":
                continue
            try:
                if e.is_dir():
                    subdirs.append(Path(e.path))
                    continue
                if e.is_file():
                    files.append(Path(e.path))
                    continue
            except OSError:
                pass
            why = _not_regular(Path(e.path))
            if why:
                skipped.append(Skip(Path(e.path).relative_to(root).as_posix(), why))
        subdirs.sort(key=os.path.islink)  # real folders first: a link (wandb/latest-run) must not hide its target
        stack.extend(reversed(subdirs))
    return files


def _is_config(path: Path) -> bool:
    name = path.name.lower()
    if name.endswith((".yaml", ".yml")):
        return True
    return name.endswith(".json") and (name in _CONFIG_JSON or name.endswith("config.json"))


def _looks_like_log(path: Path) -> bool:
    name = path.name.lower()
    if "tfevents" in name or name in ("stdout", "stderr", "log", "output"):
        return True
    if not name.endswith(LOG_SUFFIXES) or _QUIET_TXT.match(name) or _QUIET_JSON.search(name):
        return False
    return not name.endswith(".json") or bool(_LOG_HINT.search(name))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def _load_config(path: Path) -> Any:
    """A config file as parsed data (YAML via ``yaml.safe_load``, JSON via ``json``), else its raw text."""
    size = path.stat().st_size
    if size > _MAX_CONFIG_BYTES:
        return f"<not loaded: {size} bytes>"
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix.lower() == ".json":
            return _jsonable(json.loads(text))
        import yaml

        return _jsonable(yaml.safe_load(text))
    except Exception:  # noqa: BLE001 - a config that does not parse is kept as text
        return text


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
    claims, skipped, _, _ = _discover(_check_root(run_dir))
    return claims, skipped


def _unreadable(path: Path) -> str | None:
    """Why a regular file is not handed to a parser: no read permission, or ``*.gz`` that is not gzip.

    Checkpoint files are left to :mod:`parsers.checkpoints`, which reports them itself.
    """
    if path.name.lower().endswith(_CHECKPOINT_SUFFIXES):
        return None
    if not os.access(path, os.R_OK):
        return PERMISSION_DENIED
    if _lfs_pointer(path):
        return LFS_POINTER
    return gzip_problem(path)


LFS_POINTER = ("a Git LFS pointer file, not the file itself (the content was never downloaded: run "
               "`git lfs pull` in the repository); not read")
_LFS_MAGIC = b"version https://git-lfs.github.com/spec/v1"


def _lfs_pointer(path: Path) -> bool:
    """True for a Git LFS pointer (a small text file that starts with the LFS spec line)."""
    try:
        if path.stat().st_size > 1024:
            return False
        with open(path, "rb") as fh:
            return fh.read(len(_LFS_MAGIC)) == _LFS_MAGIC
    except OSError:
        return False


def _discover(root: Path) -> tuple[list[tuple[Path, Any]], list[Skip], list[Path], dict[str, str]]:
    mods, unavailable = _parsers()
    skipped: list[Skip] = []
    files = _walk(root, skipped)
    claims, configs = [], []
    for path in files:
        why = _unreadable(path)
        if why:
            skipped.append(Skip(path.relative_to(root).as_posix(), why))
            continue
        mod = None
        for m in mods:
            try:
                ok = bool(m.sniff(path))
            except Exception:  # noqa: BLE001 - sniff must never raise; treat as "not mine"
                ok = False
            if ok:
                mod = m
                break
        if mod is not None:
            claims.append((path, mod))
        elif _is_config(path) or path.suffix.lower() in (".md", ".markdown"):
            configs.append(path)  # markdown = the team's notes (attempts, logbook), kept as text
        elif _looks_like_log(path):
            why = "no parser recognised the format" if os.access(path, os.R_OK) else "cannot read the file"
            skipped.append(Skip(path.relative_to(root).as_posix(), why))
    if not files:
        raise InputError(root, _with_skips(NO_LOGS, skipped) if any(root.iterdir()) else "folder is empty")
    return claims, skipped, configs, unavailable


def _with_skips(message: str, skipped: list[Skip]) -> str:
    """``message`` plus the first few inputs that were not read, so an error names what was skipped."""
    if not skipped:
        return message
    more = f" (+{len(skipped) - 3} more)" if len(skipped) > 3 else ""
    return message + "; not read: " + "; ".join(f"{s.what}: {s.reason}" for s in skipped[:3]) + more


def _bounds(pr: ParseResult) -> dict[str, Any]:
    """First wall time, last wall time, first step (local segment 0), last step (last local segment)."""
    t = pr.metrics
    if t.num_rows == 0:
        return {"rows": 0, "segments": 0}
    seg = t.column("segment")
    n_local = pc.max(seg).as_py() + 1
    first = t.filter(pc.equal(seg, 0))
    last = t.filter(pc.equal(seg, n_local - 1))
    walls = pc.min_max(t.column("wall_time")).as_py()
    first_wall, last_wall = (w if w is not None and math.isfinite(w) else None for w in walls.values())
    return {"rows": t.num_rows, "segments": n_local, "first_wall": first_wall, "last_wall": last_wall,
            "first_step": pc.min(first.column("step")).as_py() if first.num_rows else None,
            "last_step": pc.max(last.column("step")).as_py(),
            "steps": pc.count_distinct(t.column("step")).as_py()}


def _order_key(item: tuple[str, ParseResult, dict]) -> tuple:
    rel, _, b = item
    wall = b.get("first_wall")
    return (wall is None, wall or 0.0, _natural(rel))


def _groups(items: list[tuple[str, ParseResult, dict]]) -> dict[str, str]:
    """Group key of each source (see the module docstring)."""
    out: dict[str, str] = {}
    chains: list[dict[str, Any]] = []
    for rel, pr, b in sorted(items, key=_order_key):
        parent = rel.rpartition("/")[0]
        if pr.format == "wandb" and pr.meta.get("run_id"):
            out[rel] = f"wandb:{pr.meta['run_id']}"  # one W&B run: its offline-run-* folders, one per resume
            continue
        if pr.format == "mlflow" and pr.meta.get("store") == "file":
            out[rel] = f"mlflow:{rel}"  # one file per metric key of a run: a sibling file is no resume
            continue
        if pr.format != "tensorboard":
            out[rel] = f"{pr.format}:{parent or '.'}"
            continue
        if b["rows"] == 0 or b.get("first_wall") is None or ("hparams" in pr.meta and b["steps"] <= 1):
            out[rel] = f"tensorboard:{rel}"  # no rows, or an add_hparams side file: on its own
            continue
        free = [c for c in chains if c["end"] <= b["first_wall"]]
        same = [c for c in free if c["dir"] == parent]
        pick = max(same or free, key=lambda c: c["end"], default=None)
        if pick is None:
            pick = {"id": len(chains), "end": b["first_wall"], "dir": parent}
            chains.append(pick)
        pick["end"], pick["dir"] = max(pick["end"], b["last_wall"] or pick["end"]), parent
        out[rel] = f"tensorboard#{pick['id']}"
    return out


def _offsets(items: list[tuple[str, ParseResult, dict]], groups: dict[str, str],
             continued: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Global segment offset of each source: local segment + offset = global segment.

    A text log that follows another one of its folder is a new launch, so a new segment, even when its
    steps continue forward; such files are put in ``continued`` (rel -> (previous last step, first step))
    and get a ``restart`` event.
    """
    offsets: dict[str, int] = {}
    continued.clear()
    state: dict[str, tuple[int, int]] = {}  # group -> (global segment of the last file's end, its last step)
    for rel, _, b in sorted(items, key=_order_key):
        g = groups[rel]
        prev = state.get(g)
        if b["rows"] == 0:
            offsets[rel] = prev[0] if prev else 0
            continue
        if prev is None:
            off = 0
        elif g.startswith("wandb:"):  # each W&B run folder of a run id is a new process (a resume)
            off = prev[0] + 1
        elif g.startswith("textlog:"):  # each stdout file is one launch: a later file is a new segment
            off = prev[0] + 1
            if b["first_step"] is not None and b["first_step"] > prev[1]:
                continued[rel] = (prev[1], b["first_step"])
        else:
            off = prev[0] + 1 if b["first_step"] is None or b["first_step"] <= prev[1] else prev[0]
        offsets[rel] = off
        state[g] = (off + b["segments"] - 1, b["last_step"])
    return offsets


def _with_run(t: pa.Table, schema: pa.Schema, run: str, offset: int) -> pa.Table:
    t = t.select(schema.names).cast(schema)
    n = t.num_rows
    t = t.set_column(0, schema.field("run"), pa.array([run] * n, pa.string()))
    seg = pc.add(t.column("segment").cast(pa.int64()), offset).cast(pa.int32())
    return t.set_column(t.schema.get_field_index("segment"), schema.field("segment"), seg)


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
    root = _check_root(run_dir)
    claims, skipped, configs, unavailable = _discover(root)
    if ignore:
        kept = []
        for path, mod in claims:
            rel = path.relative_to(root).as_posix()
            if any(PurePosixPath(rel).match(g) or fnmatch.fnmatch(rel, g) for g in ignore):
                skipped.append(Skip(rel, "ignored (forensics.toml: ignore)"))
            else:
                kept.append((path, mod))
        claims = kept
    token = STEP_KEY.set(step_key)
    try:
        return _load(root, run_dir, claims, skipped, configs, unavailable, reader)
    finally:
        STEP_KEY.reset(token)


def _load(root: Path, run_dir: str | Path, claims: list, skipped: list[Skip], configs: list[Path],
          unavailable: dict[str, str], reader: Callable[[Path, Any, Path], ParseResult] | None) -> RunData:
    results: list[tuple[str, ParseResult, dict]] = []
    failures: list[Skip] = []
    for path, mod in claims:
        rel = path.relative_to(root).as_posix()
        fmt = getattr(mod, "FORMAT", mod.__name__.rpartition(".")[2])
        try:
            pr = mod.read(path, root) if reader is None else reader(path, mod, root)
        except ParseError as exc:
            failures.append(Skip(rel, _one_line(exc.message)))
            continue
        except Exception as exc:  # noqa: BLE001 - one bad file never stops the run
            why = _one_line(f"the {fmt} parser failed: {type(exc).__name__}: {exc}")
            failures.append(Skip(rel, why))
            continue
        results.append((rel, pr, _bounds(pr)))
        skipped.extend(pr.skipped)
    if not results:
        if failures:
            why = "; ".join(f"{s.what}: {s.reason}" for s in failures[:3])
            raise InputError(root, f"no readable training log ({len(failures)} found, none readable: {why})")
        raise InputError(root, _with_skips(NO_LOGS, skipped))
    skipped.extend(failures)
    groups = _groups(results)
    continued: dict[str, tuple[int, int]] = {}
    offsets = _offsets(results, groups, continued)
    run = root.name
    metrics, events, sources = [], [], []
    meta: dict[str, Any] = {"run": run, "formats": sorted({pr.format for _, pr, _ in results}),
                            "config_files": {}, "by_source": {}, "source_groups": {}, "precision": {},
                            "hparams": {}}
    for rel, pr, _ in results:
        try:
            m = _with_run(pr.metrics, METRICS_SCHEMA, run, offsets[rel])
            e = _with_run(pr.events, EVENTS_SCHEMA, run, offsets[rel])
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
            skipped.append(Skip(rel, f"the {pr.format} parser returned a malformed table: {exc}"))
            continue
        if rel in continued:
            last, first = continued[rel]
            e = pa.concat_tables([e, pa.table({
                "run": [run], "segment": pa.array([offsets[rel]], pa.int32()), "step": pa.array([first], pa.int64()),
                "kind": ["restart"], "message": [f"{rel}: a new log file (a new launch) continues at step {first} "
                                                 f"after step {last} of the previous file"],
                "source": [rel]}, schema=EVENTS_SCHEMA)])
        metrics.append(m)
        events.append(e)
        segs = pc.count_distinct(m.column("segment")).as_py() if m.num_rows else 0
        sources.append(SourceInfo(path=rel, format=pr.format, records=m.num_rows, segments=segs))
        meta["by_source"][rel] = _jsonable(dict(pr.meta))
        meta["source_groups"][rel] = groups[rel]
        meta["precision"][rel] = pr.precision
        if isinstance(pr.meta.get("hparams"), dict):
            meta["hparams"].update(pr.meta["hparams"])
        if pr.meta.get("framework") and "framework" not in meta:
            meta["framework"] = pr.meta["framework"]
    for path in configs[:_MAX_CONFIGS]:
        try:
            if path.suffix.lower() in (".md", ".markdown"):
                if path.stat().st_size <= _MAX_CONFIG_BYTES:
                    meta.setdefault("notes", {})[path.relative_to(root).as_posix()] = path.read_text(
                        encoding="utf-8", errors="replace")
                continue
            meta["config_files"][path.relative_to(root).as_posix()] = _load_config(path)
        except OSError as exc:
            skipped.append(Skip(path.relative_to(root).as_posix(), f"config file unreadable: {exc.strerror}"))
    if unavailable:
        meta["parsers_unavailable"] = unavailable
    mt = pa.concat_tables(metrics) if metrics else METRICS_SCHEMA.empty_table()
    et = pa.concat_tables(events) if events else EVENTS_SCHEMA.empty_table()
    tensors, updates = _read_checkpoints(root, run, meta, skipped)
    return RunData(run=str(run_dir), metrics=pl.from_arrow(mt), events=pl.from_arrow(et), meta=meta,
                   sources=sources, skipped=skipped, tensors=tensors, updates=updates)


def _read_checkpoints(root: Path, run: str, meta: dict[str, Any], skipped: list[Skip]) -> tuple[Any, Any]:
    """The ``tensors``/``updates`` tables of the run's checkpoints (empty, after a walk of names, when none)."""
    from parsers.checkpoints import read_checkpoints

    try:
        tensors, updates, ck_meta, ck_skipped = read_checkpoints(root, run)
    except Exception as exc:  # noqa: BLE001 - a checkpoint reader bug never stops the log analysis
        skipped.append(Skip("checkpoints", _one_line(f"checkpoint reader failed: {type(exc).__name__}: {exc}")))
        return pl.DataFrame(), pl.DataFrame()
    skipped.extend(ck_skipped)
    if ck_meta:
        meta["checkpoints"] = ck_meta
    return tensors, updates
