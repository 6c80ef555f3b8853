"""Walking a run folder and claiming its files: which parser reads each file, which are configs or notes.

The parsers are the modules of :data:`parsers.PARSER_MODULES`, asked in order (the first whose
``sniff`` says yes reads the file; a module that is missing or fails to import is left out and named
in ``meta["parsers_unavailable"]``). Files nobody claims are listed in ``skipped`` only when they
look like logs; configuration files (``*.yaml``, ``config.json``, ``*_config.json``, ...) and notes
(``*.md``) are returned apart; everything else (checkpoints, scripts) is ignored silently. Files no
parser may read are always listed in ``skipped`` and never reach a parser: FIFOs, sockets, devices and
dangling symlinks (checked with ``os.stat``, never opened), files without read permission, ``*.gz``
files that are not gzip data, Git LFS pointers. Symlinks out of the run follow the file-access policy
(:mod:`parsers.file_policy`).
"""

from __future__ import annotations

import importlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from forensics.errors import InputError
from forensics.model import Skip
from parsers import PARSER_MODULES, file_policy
from parsers._io import gzip_problem

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


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs joined), cut to ``limit`` characters with ``...``."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def natural(s: str) -> list:
    """A sort key that orders digit runs by value (``v2`` before ``v10``)."""
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


def check_root(run_dir: str | Path) -> Path:
    """The run folder, resolved.

    Raises:
        InputError: It does not exist or is not a folder.
    """
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
                entries = sorted(it, key=lambda e: natural(e.name))
        except OSError as exc:
            where = rel_path(folder, root) or "."
            skipped.append(Skip(where, f"cannot list folder: {exc.strerror or exc}"))
            continue
        subdirs = []
        for e in entries:
            if e.name.startswith(".") and e.name not in _KEEP_HIDDEN or e.name == "__pycache__":
                continue
            try:
                if e.is_symlink():  # the file-access policy: never out of the run, never /proc, /sys, /dev
                    why = file_policy.why_not(e.path, root, folder=True)
                    if why and _writer_debug_link(Path(e.path)):
                        continue  # wandb's own debug log, linked into ~/.cache: no metrics, nothing lost
                    if why:
                        skipped.append(Skip(rel_path(Path(e.path), root), why))
                        continue
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
                skipped.append(Skip(rel_path(Path(e.path), root), why))
        subdirs.sort(key=os.path.islink)  # real folders first: a link (wandb/latest-run) must not hide its target
        stack.extend(reversed(subdirs))
    return files


def _writer_debug_link(path: Path) -> bool:
    """A symlink wandb itself puts in every run (``wandb/<run>/logs/debug-core.log`` -> ``~/.cache/wandb``).

    The W&B client's debug logs hold no metrics (:mod:`parsers.wandb_run` never reads them), so a link of
    one that leads out of the run folder is left out without a ``skipped`` entry: listing it would lower the
    confidence of every wandb run for a file nobody wants read.
    """
    from parsers.wandb_run import DEBUG_LOGS  # the W&B reader's own list of them

    return path.name in DEBUG_LOGS and path.parent.name in ("logs", "wandb")


def rel_path(path: Path, root: Path) -> str:
    """``path`` relative to the run folder, escaped for every output (:func:`parsers.file_policy.display`)."""
    return file_policy.rel(path, root)


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
    if own_output(path):
        return OWN_OUTPUT
    return gzip_problem(path)


OWN_OUTPUT = "a train-forensics output (a report or an ingest table), not a training log; not read"
_INGEST_TABLES = frozenset({"metrics.parquet", "events.parquet", "tensors.parquet", "updates.parquet"})


def own_output(path: Path) -> bool:
    """True for a file this tool wrote: a text or Markdown report, or an ingest table beside its ``run.json``.

    Users keep reports in the run folder (``forensics analyze run -f text > run/forensics.txt``); read back, a
    report's ``evidence: ... step 301`` lines would be a second log (a phantom restart) and its trial's words
    (``peak lr x0.5``) failed-remedy notes, and an ingest folder would double every point.
    """
    name = path.name.lower()
    try:
        if name in _INGEST_TABLES:
            head = _head(path.parent / "run.json", 256)
            return head.lstrip().startswith(b"{") and b'"run"' in head and b'"meta"' in head
        if name.endswith((".txt", ".log", ".out", ".md", ".markdown")):
            head = _head(path, 512)
            return (head.startswith(b"run:") and b"\nverdict:" in head) or head.startswith(b"# train-forensics:")
    except OSError:
        return False
    return False


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


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


def claim_files(root: Path) -> tuple[list[tuple[Path, Any]], list[Skip], list[Path], dict[str, str]]:
    """Walk ``root`` and give each file its parser.

    Returns:
        ``(claims, skipped, configs, unavailable)``: ``(path, parser module)`` in walk order; what was
        not read and why; config and notes files; parser modules that could not be imported -> why.

    Raises:
        InputError: The folder holds no file at all.
    """
    mods, unavailable = _parsers()
    skipped: list[Skip] = []
    files = _walk(root, skipped)
    claims, configs = [], []
    for path in files:
        why = _unreadable(path)
        if why:
            skipped.append(Skip(rel_path(path, root), why))
            continue
        if _is_config(path) and path.name.lower().endswith(".json"):  # config.json on one line is no JSONL log
            configs.append(path)
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
            skipped.append(Skip(rel_path(path, root), why))
    if not files:
        raise InputError(root, with_skips(NO_LOGS, skipped) if any(root.iterdir()) else "folder is empty")
    return claims, skipped, configs, unavailable


def with_skips(message: str, skipped: list[Skip]) -> str:
    """``message`` plus the first few inputs that were not read, so an error names what was skipped."""
    if not skipped:
        return message
    more = f" (+{len(skipped) - 3} more)" if len(skipped) > 3 else ""
    return message + "; not read: " + "; ".join(f"{s.what}: {s.reason}" for s in skipped[:3]) + more
