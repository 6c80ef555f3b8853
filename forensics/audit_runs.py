"""The audit's run discovery: the run folders under a local folder or an fsspec URL, as tasks.

Run discovery (:func:`find_runs`) follows the rules of :mod:`forensics.layout` (shared with ``sweep``):
a folder that holds logs is a run, a folder of runs is a container at any depth, the attempts of one W&B
run belong to it, and a folder whose parts carry different configurations holds several runs.

On an fsspec URL the same rules run over ``fs.find``; content sniffing reads the first 64 KiB of
candidate files (one batched ``cat_ranges``). The analysis of one run is :mod:`forensics.audit_worker`.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from forensics.errors import InputError
from forensics.layout import PART_NAME, claimed, file_reader, local_tree, pick_runs  # noqa: F401 - PART_NAME kept importable here
from forensics.layout import sniffers as layout_sniffers
from parsers.file_policy import display

CACHE_VERSION = 1
NAME_CHARS = 160
"""Longest ``OUT/runs/<name>`` (ASCII after escaping): the cache's ``.<name>.json.<random>.tmp`` must stay under
the 255-byte file-name limit of Linux file systems (NAME_MAX); a longer run path keeps its start and a hash."""
_HEAD = 64 * 1024


@dataclass(frozen=True)
class RunTask:
    """One run to analyse (picklable: it travels to worker processes and Dask workers).

    Attributes:
        run: The run's folder relative to ROOT (ROOT's own name when ROOT itself is the run).
        name: A file-system safe, unique name for ``OUT/runs/<name>/`` and the cache.
        path: Local folder, or the run folder's URL.
        parent: The parent folder relative to ROOT (the cohort when no configuration is found).
        key: Cache key: analyser version and the run's files (relative paths, sizes, mtimes).
        files: ``(relative path, size)`` of the run's files (used to download a remote run).
        formats: Report formats to render.
        storage_options: fsspec options for a remote run.
    """

    run: str
    name: str
    path: str
    parent: str
    key: str
    files: tuple[tuple[str, int], ...] = ()
    formats: tuple[str, ...] = ("html", "json")
    storage_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        """True when the run lives behind an fsspec URL."""
        return is_url(self.path)


@dataclass
class _Dir:
    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (size, mtime/etag)
    dirs: list[str] = field(default_factory=list)
    direct: bool = False  # holds a log file itself
    logs: bool | None = None  # holds a log file somewhere below (computed once)


def is_url(root: str | Path) -> bool:
    """True for an fsspec URL such as ``s3://bucket/runs`` (``file://`` counts as local)."""
    s = str(root)
    return "://" in s and not s.startswith("file://")


def find_runs(root: str | Path, *, exclude: str | Path | None = None,
              storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The run folders under ``root`` (module docstring), as paths or URLs, sorted.

    Args:
        root: A local folder or an fsspec URL.
        exclude: A local folder to leave out (the audit's output folder when it lies inside ROOT).
        storage_options: fsspec options for a URL.

    Raises:
        InputError: ``root`` does not exist or is not a folder.
    """
    return [t.path for t in list_runs(root, exclude=exclude, storage_options=storage_options)]


def list_runs(root: str | Path, *, exclude: str | Path | None = None,
              storage_options: Mapping[str, Any] | None = None,
              formats: tuple[str, ...] = ("html", "json")) -> list[RunTask]:
    """Like :func:`find_runs`, with each run's cache key and file list (the audit's tasks)."""
    from forensics import SCHEMA_VERSION, __version__

    so = dict(storage_options or {})
    if is_url(root):
        tree, base = _remote_tree(str(root), so)
    else:
        tree, base = local_tree(str(root).removeprefix("file://"), exclude)
    picked = pick_runs(tree, PurePosixPath(base).name, None if is_url(root) else file_reader(base))
    picked = [*picked, *unclaimed_logs(tree, picked)]
    names: dict[str, str] = {}
    tasks = []
    for rel in sorted(set(picked)):
        run = display(rel or PurePosixPath(base).name or "run")  # a non-UTF-8 folder name: kept escaped
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run.replace("/", "__")).lstrip(".") or "run"
        if len(safe) > NAME_CHARS:  # a deep sweep path: the file names built on it must stay under NAME_MAX
            safe = f"{safe[:NAME_CHARS - 9]}-{hashlib.sha1(run.encode()).hexdigest()[:8]}"
        if safe.lower() in names:
            safe = f"{safe}-{hashlib.sha1(run.encode()).hexdigest()[:8]}"
        names[safe.lower()] = run
        files = sorted(_subtree_files(tree, rel))
        key = hashlib.sha256(json.dumps([CACHE_VERSION, __version__, SCHEMA_VERSION, files]).encode()).hexdigest()
        path = f"{base.rstrip('/')}/{rel}" if rel else base
        tasks.append(RunTask(run=run, name=safe, path=path, parent=str(PurePosixPath(rel).parent) if rel else ".",
                             key=key, files=tuple((f, s) for f, s, _ in files), formats=formats,
                             storage_options=so))
    return tasks


LOG_LIKE = (".log", ".out", ".err", ".txt", ".csv", ".tsv", ".jsonl", ".ndjson")
"""File suffixes that look like a training log: a folder holding one that no parser reads is listed as a run, so the
audit gives it an error row ("no parser recognised the format") instead of leaving it out without a word."""
_NOT_LOGS = re.compile(r"^(?:readme|license|licence|changelog|contributing|requirements[\w.-]*)(?:\.[a-z]+)?$", re.I)


def unclaimed_logs(tree: Mapping[str, Any], picked: list[str]) -> list[str]:
    """Folders with a log-like file no parser claimed, outside and not above any picked run (relative, sorted).

    A folder counts when it holds a non-empty file with a :data:`LOG_LIKE` suffix (not a README, LICENSE or
    requirements file) and no file a parser claims.
    """
    runs = set(picked)
    above = {"/".join(parts[:i]) for r in picked if r for parts in [r.split("/")] for i in range(len(parts))}

    def near_run(rel: str) -> bool:  # a run, inside one, or above one: O(depth) per folder, not O(runs)
        parts = rel.split("/") if rel else []
        return rel in above or any("/".join(parts[:i]) in runs for i in range(len(parts) + 1))

    out = []
    for rel, node in tree.items():
        if node.direct or near_run(rel):
            continue
        if any(PurePosixPath(name).suffix.lower() in LOG_LIKE and not _NOT_LOGS.match(name) and _size(meta) > 0
               for name, meta in node.files.items()):
            out.append(rel)
    return sorted(out)


def _size(meta: Any) -> int:
    return int(meta[0]) if isinstance(meta, tuple | list) and meta else 0


def _subtree_files(tree: dict[str, _Dir], rel: str) -> list[tuple[str, int, str]]:
    out, stack = [], [rel]
    while stack:
        d = stack.pop()
        for f, (size, mtime) in tree[d].files.items():
            full = f"{d}/{f}" if d else f
            out.append((full[len(rel) + 1:] if rel else full, size, mtime))
        stack.extend(tree[d].dirs)
    return out


def remote_fs(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(filesystem, path)`` for an fsspec URL; ``FSSPEC_<PROTOCOL>_<KWARG>`` variables are honoured.

    Raises:
        InputError: fsspec (or the protocol's package, e.g. s3fs) is not installed.
    """
    try:
        import fsspec
        import fsspec.config
    except ImportError as exc:
        raise InputError(url, "a URL root needs fsspec: pip install 'train-forensics[distributed]'") from exc
    fsspec.config.set_conf_env(fsspec.config.conf)  # variables set after fsspec was imported count too
    try:
        return fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise InputError(url, f"cannot open: {exc}") from exc


def _remote_tree(url: str, so: Mapping[str, Any]) -> tuple[dict[str, _Dir], str]:
    fs, top = remote_fs(url, so)
    top = top.rstrip("/")
    fs.invalidate_cache()
    try:
        infos = fs.find(top, detail=True)
    except (OSError, FileNotFoundError) as exc:
        raise InputError(url, f"cannot list: {exc}") from exc
    if not infos:
        raise InputError(url, "no such folder, or it is empty")
    tree: dict[str, _Dir] = {"": _Dir()}
    heads: list[tuple[str, str, int]] = []  # remote path, relative path, bytes to read
    for full, info in sorted(infos.items()):
        rel = full[len(top):].lstrip("/")
        parts = rel.split("/")
        hidden = any(p.startswith(".") and p != ".hydra" or p == "__pycache__" for p in parts)
        if not rel or info.get("type") == "directory" or hidden:
            continue
        for i in range(len(parts) - 1):
            d, parent = "/".join(parts[:i + 1]), "/".join(parts[:i])
            if d not in tree:
                tree[d] = _Dir()
                tree[parent].dirs.append(d)
        size = int(info.get("size") or 0)
        stamp = str(info.get("LastModified") or info.get("mtime") or info.get("ETag") or info.get("etag") or "")
        tree["/".join(parts[:-1])].files[parts[-1]] = (size, stamp)
        name = parts[-1].lower()
        want = size if name.endswith(".parquet") and size <= 8 << 20 else min(size, _HEAD)
        heads.append((full, rel, want))
    with tempfile.TemporaryDirectory(prefix="forensics-sniff-") as tmp:
        fetch = [h for h in heads if h[2] > 0]
        got = fs.cat_ranges([h[0] for h in fetch], [0] * len(fetch), [h[2] for h in fetch],
                            on_error="return") if fetch else []
        by_path = dict(zip([h[0] for h in fetch], got, strict=True))
        data = [by_path.get(h[0], b"") for h in heads]
        sniffers = layout_sniffers()
        for (_, rel, _), blob in zip(heads, data, strict=True):
            stub = Path(tmp) / rel
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_bytes(blob if isinstance(blob, bytes) else b"")
            d = rel.rpartition("/")[0]
            if not tree[d].direct and (claimed(stub, sniffers) or rel.lower().endswith(".parquet")):
                tree[d].direct = True
    return tree, fs.unstrip_protocol(top)
