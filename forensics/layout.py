"""Run folders under a root, at any depth: the one run-finding rule set that ``sweep`` and ``audit`` share.

A *log file* is a file one of the parsers of :data:`parsers.PARSER_MODULES` claims (their ``sniff``). A
*run* is the folder that holds one run's logs. Folders are walked from ROOT down (hidden entries but
``.hydra``, ``__pycache__`` and symlinked folders left out) into a tree of :class:`Folder`; then each
folder F is decided by :func:`pick_runs`:

1. F is named ``wandb`` and holds ``run-*`` / ``offline-run-*`` folders of two or more run ids (the id is
   the part after the last ``-``): each id is one run (its first folder names it). Several folders of ONE
   id are the attempts (resumes) of one run and belong to it: the ``wandb`` folder is an ordinary part of
   the folder above it, as a ``wandb`` folder with a single run is.
2. F holds a log file itself: F is one run (with everything below it).
3. Nothing below F holds a log file: no run.
4. A ``wandb`` sub-folder of several run ids is decided by rule 1; F's other sub-folders that hold logs
   are its *parts*.
5. F is a *container* (its parts are decided one by one) when any of these holds:

   a. a part is itself a container of several runs (a run never holds several runs: this is what makes
      ``ROOT/sweep_a/width_32/lr_0.01/`` work at any depth, whatever files the sweep folders hold);
   b. two or more parts carry a configuration (``config.json``/``.yaml``, ``hparams.yaml``, ``args.json``,
      a W&B ``files/config.yaml``...) and the configurations differ in a setting that defines a run (any
      key but names, paths, ids, times, and the resume/horizon keys of :data:`RESUME_KEYS`): runs of a
      sweep, not attempts of one job (role folders of one run, ``train``/``eval``/``logs``..., are not
      compared: their configurations differ by design);
   c. F is ROOT, unless all its parts have names that belong inside a run (``version_N``,
      ``checkpoint-N``, ``lightning_logs``, ``logs``, ``train``/``eval``..., :data:`PART_NAME`);
   d. F holds no file of its own (docs, scripts and hidden files do not count: :data:`_NOT_OWN`) and no
      part has such a name.
6. Otherwise F is one run: the highest folder that groups its logs (``exp/lightning_logs/version_*`` with
   equal hparams and ``exp/output/checkpoint-*`` give ``exp``; a case folder with ``expected.json`` and
   two output folders without configurations gives the case folder).

Rule 5b reads the small configuration files of the parts (at most :data:`CONFIG_MAX_BYTES` each); a
tree without file access (a remote listing) skips it and keeps rules 5a, 5c, 5d.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from forensics.errors import InputError
from parsers import file_policy

PART_NAME = re.compile(
    r"^(?:(?:version|checkpoint|ckpt|global_step|step|epoch|iter|attempt|restart|resume|segment|part)[-_]?\d+"
    r"|lightning_logs|logs?|runs|tb|tb_logs|tensorboard|events|metrics|checkpoints|ckpts?|output|outputs"
    r"|results|train|training|val|valid|validation|eval|evaluation|test|wandb|wandb_export|files|history)$", re.I)
"""Sub-folder names that belong inside one run (rule 5c/5d of the module docstring)."""
WANDB_RUN = re.compile(r"^(?:offline-)?run-(?:[^/]*-)?(?P<id>[^/-]+)$")
"""A W&B run folder, ``run-<date>_<time>-<id>`` or ``offline-run-...-<id>``."""
CONFIG_FILE = re.compile(r"^(?:config|hparams|args|params|hyperparameters|training_args|run_config|cfg|"
                         r"train_config|experiment)\.(?:json|ya?ml)$", re.I)
"""Configuration files read by rule 5b."""
CONFIG_MAX_BYTES = 1 << 20
VOLATILE = re.compile(r"(?:^|[._])(?:name|names|dir|dirs|path|paths|file|root|id|uuid|time|timestamp|date|"
                      r"host|hostname|node|job|slurm|pid|port|rank|local_rank|wandb|project|entity|group|tags?|"
                      r"notes|url|output|log|logging|save|cache|git|commit|version|_wandb|run)(?:$|[._])", re.I)
"""Key paths that name or place a run but do not define it (ignored by rule 5b)."""
RESUME_KEYS = re.compile(r"(?:^|[._])(?:resume\w*|restart\w*|load\w*|init_from|from_checkpoint|checkpoint\w*|"
                         r"ckpt\w*|max_steps|total_steps|train_iters|num_training_steps|max_iters|steps|"
                         r"train_steps|max_train_steps|max_epochs|num_train_epochs|epochs)(?:$|[._])", re.I)
"""Keys a resumed attempt of one job may change (ignored by rule 5b): a new horizon is still one run."""
_NOT_OWN = re.compile(r"^(?:(?:readme|license|licence|changelog|contributing|notice|authors)(?:\.[a-z]+)?"
                      r"|.+\.(?:py|pyi|sh|bash|zsh|slurm|sbatch|pbs|ipynb|md|rst|toml|cfg|ini|lock)"
                      r"|makefile|dockerfile|requirements[\w.-]*\.txt|environment\.ya?ml)$", re.I)
"""Files that do not make a folder a run of its own (rule 5d): docs, and the scripts, notebooks and environment
files that launch runs (``exp/train.py`` beside ``exp/seed_1/``, ``exp/seed_2/`` is a sweep's folder, user test U13)."""


class TreeNode(Protocol):
    """What :func:`pick_runs` reads of a folder (the audit's remote listing provides the same fields)."""

    files: dict[str, Any]
    dirs: list[str]
    direct: bool
    logs: bool | None


@dataclass
class Folder:
    """One folder of the walked tree.

    Attributes:
        files: File name -> ``(size in bytes, mtime in ns as str)``.
        dirs: Sub-folders, as paths relative to ROOT (``"a/b"``).
        direct: True when the folder holds a log file itself.
        logs: True when a log file lies anywhere below (computed once by :func:`pick_runs`).
    """

    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)
    direct: bool = False
    logs: bool | None = None


def sniffers() -> list[Callable[[Path], bool]]:
    """The ``sniff`` of every parser that imports (one that cannot load claims nothing)."""
    from parsers import PARSER_MODULES

    out = []
    for name in PARSER_MODULES:
        try:
            out.append(importlib.import_module(name).sniff)
        except Exception:  # noqa: BLE001 - a parser that cannot load claims nothing (discover says why)
            continue
    return out


def claimed(path: Path, sniff: list[Callable[[Path], bool]]) -> bool:
    """True when a parser claims the file (``sniff`` never raises here)."""
    for s in sniff:
        try:
            if s(path):
                return True
        except Exception:  # noqa: BLE001 - sniff must never raise; treat as "not mine"
            continue
    return False


def local_tree(root: str | Path, exclude: str | Path | None = None) -> tuple[dict[str, Folder], str]:
    """Walk a local folder into ``({relative folder: Folder}, root as str)`` (``""`` is ROOT).

    Raises:
        InputError: ``root`` does not exist or is not a folder.
    """
    top = Path(str(root).removeprefix("file://")).expanduser()
    if not top.exists():
        raise InputError(root, "no such file or directory")
    if not top.is_dir():
        raise InputError(root, "not a directory (give the folder that holds the runs)")
    skip = Path(exclude).resolve() if exclude is not None else None
    sniff, tree, stack = sniffers(), {}, [""]
    while stack:
        rel = stack.pop()
        node = tree[rel] = Folder()
        try:
            with os.scandir(top / rel if rel else top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            if not rel:  # the root itself: its reason, not "no run folders found"
                raise InputError(root, f"cannot list the folder: {exc.strerror or exc}") from exc
            continue
        for e in entries:
            if e.name.startswith(".") and e.name != ".hydra" or e.name == "__pycache__":
                continue
            sub = f"{rel}/{e.name}" if rel else e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    if skip is None or Path(e.path).resolve() != skip:
                        node.dirs.append(sub)
                        stack.append(sub)
                elif file_policy.why_not(e.path, top) is None:  # regular, inside the root, not /proc
                    st = e.stat()
                    node.files[e.name] = (st.st_size, str(st.st_mtime_ns))
                    if not node.direct and claimed(Path(e.path), sniff):
                        node.direct = True
            except OSError:
                continue
    return tree, str(top)


def file_reader(top: str | Path) -> Callable[[str], bytes | None]:
    """A reader of small files under ``top`` by relative path (``None`` when unreadable or too large)."""
    base = Path(top)

    def read(rel: str) -> bytes | None:
        p = base / rel
        try:
            if file_policy.why_not(p, base) is not None or p.is_symlink() or p.stat().st_size > CONFIG_MAX_BYTES:
                return None
            return p.read_bytes()
        except OSError:
            return None

    return read


# ----------------------------------------------------------------------------------------------- rules


def _name(rel: str) -> str:
    return rel.rpartition("/")[2]


def _has_logs(tree: Mapping[str, TreeNode], rel: str) -> bool:
    node = tree[rel]
    if node.logs is None:
        node.logs = node.direct or any(_has_logs(tree, k) for k in node.dirs)
    return bool(node.logs)


def _wandb_ids(tree: Mapping[str, TreeNode], rel: str) -> dict[str, list[str]]:
    """Run id -> the ``run-*`` folders of that id (that hold logs) in a ``wandb`` folder, in name order."""
    out: dict[str, list[str]] = {}
    for k in sorted(tree[rel].dirs):
        m = WANDB_RUN.match(_name(k))
        if m and _has_logs(tree, k):
            out.setdefault(m.group("id"), []).append(k)
    return out


def _parse(blob: bytes, name: str) -> Any:
    try:
        text = blob.decode("utf-8")
        if name.lower().endswith(".json"):
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception:  # noqa: BLE001 - an unreadable config says nothing about the layout
        return None


def _flat(obj: Any, prefix: str = "", depth: int = 5) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(obj, Mapping) and depth > 0:
        if set(obj) >= {"value"} and set(obj) <= {"value", "desc"}:  # W&B {"value": v} wrapping
            return _flat(obj["value"], prefix, depth)
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{str(k).lower()}.", depth - 1))
    elif prefix:
        out[prefix[:-1]] = repr(obj)
    return out


def defining(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a flat configuration that define a run (module docstring, rule 5b)."""
    return {k: v for k, v in cfg.items() if not VOLATILE.search(k) and not RESUME_KEYS.search(k)}


def part_config(tree: Mapping[str, TreeNode], rel: str, read: Callable[[str], bytes | None]) -> dict[str, Any] | None:
    """The flat, run-defining configuration one part carries (``None`` when it carries none).

    Its own config files, else its W&B run's ``files/config.yaml`` or its ``.hydra/config.yaml``.
    """
    cands = [f"{rel}/{f}" for f in sorted(tree[rel].files) if CONFIG_FILE.match(f)]
    if not cands:
        for sub in tree[rel].dirs:
            name = _name(sub)
            if name == ".hydra" and "config.yaml" in tree[sub].files:
                cands.append(f"{sub}/config.yaml")
            elif WANDB_RUN.match(name) and f"{sub}/files" in tree and "config.yaml" in tree[f"{sub}/files"].files:
                cands.append(f"{sub}/files/config.yaml")
            elif name == "wandb":
                runs = [r for rs in _wandb_ids(tree, sub).values() for r in rs]
                if runs and f"{runs[0]}/files" in tree and "config.yaml" in tree[f"{runs[0]}/files"].files:
                    cands.append(f"{runs[0]}/files/config.yaml")
    merged: dict[str, Any] = {}
    for c in cands:
        blob = read(c)
        if blob is not None and isinstance(obj := _parse(blob, c), Mapping):
            merged.update(_flat(obj))
    return defining(merged) if merged else None


def _configs_differ(tree: Mapping[str, TreeNode], parts: list[str],
                    read: Callable[[str], bytes | None] | None) -> bool:
    if read is None:
        return False
    # role folders of one run (train/, eval/, logs/, output/...) carry different configs by design
    parts = [p for p in parts if not (PART_NAME.match(_name(p)) and not re.search(r"\d", _name(p)))]
    if len(parts) < 2:
        return False
    cfgs = [c for p in parts if (c := part_config(tree, p, read))]
    return len(cfgs) >= 2 and any(c != cfgs[0] for c in cfgs[1:])


def pick_runs(tree: Mapping[str, TreeNode], root_name: str = "",
              read: Callable[[str], bytes | None] | None = None) -> list[str]:
    """The run folders of a walked tree (relative to ROOT; ``""`` is ROOT itself), by the module's rules.

    Args:
        tree: ``{relative folder: node}`` with ``""`` for ROOT (:func:`local_tree`, or the audit's listing).
        root_name: ROOT's own folder name (rule 1 when ROOT is a ``wandb`` folder).
        read: Reader of small files by relative path (:func:`file_reader`); ``None`` skips rule 5b.

    Returns:
        The run folders, sorted, each once.
    """
    return sorted(set(_classify(tree, "", True, root_name, read)))


def _classify(tree: Mapping[str, TreeNode], rel: str, is_root: bool, root_name: str,
              read: Callable[[str], bytes | None] | None) -> list[str]:
    node = tree[rel]
    kids = [k for k in node.dirs if _has_logs(tree, k)]
    if (_name(rel) or root_name) == "wandb":
        ids = _wandb_ids(tree, rel)
        inside = {k for v in ids.values() for k in v}
        if len(ids) >= 2:
            runs = [v[0] for v in ids.values()]
            return runs + [r for k in kids if k not in inside for r in _classify(tree, k, False, "", read)]
        if ids and all(k in inside for k in kids):  # the attempts of one run id: one run
            return [rel]
    if node.direct:
        return [rel]
    wandb = [k for k in kids if _name(k) == "wandb" and len(_wandb_ids(tree, k)) >= 2]
    parts = [k for k in kids if k not in wandb]
    found = [r for k in wandb for r in _classify(tree, k, False, "", read)]
    if not parts:
        return found
    sub = {k: _classify(tree, k, False, "", read) for k in parts}
    if any(v != [k] for k, v in sub.items() if len(v) > 1) or _configs_differ(tree, parts, read):
        return found + [r for k in parts for r in sub[k]]
    own = any(not _NOT_OWN.match(f) for f in node.files)
    part_named = [bool(PART_NAME.match(_name(k))) for k in parts]
    if is_root and all(part_named) and not wandb:
        return [rel]
    if is_root or (not own and not any(part_named)):
        return found + [r for k in parts for r in sub[k]]
    return found + [rel]


def find_runs(root: str | Path, *, exclude: str | Path | None = None) -> list[Path]:
    """The run folders under a local ``root`` (module docstring), sorted.

    Args:
        root: A local folder.
        exclude: A folder to leave out (an output folder inside ROOT).

    Returns:
        Absolute-or-as-given paths of the run folders (``root`` itself when it is one run).

    Raises:
        InputError: ``root`` does not exist or is not a folder.
    """
    tree, base = local_tree(root, exclude)
    top = Path(base)
    return [top / rel if rel else top for rel in pick_runs(tree, top.name, file_reader(top))]
