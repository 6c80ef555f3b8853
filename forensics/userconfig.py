"""What the user says about a run: ``forensics.toml`` in the run folder or above it, or ``[tool.forensics]``.

The nearest file wins (the run folder first, then each parent up to the filesystem root; in each folder
``forensics.toml`` before a ``pyproject.toml`` with a ``[tool.forensics]`` table). Keys::

    aliases = { loss = "train/total", eval_loss = "val/total" }   # canonical name = series as logged
    step_key = "global_step"                                       # the step column of tables
    ignore = ["old_attempts/**", "*.bak"]                          # files not read (glob, run-relative)

``--metric NAME=COLUMN`` on the command line wins over ``aliases``. A file that does not parse is an input
error naming it (never silently ignored). The file is read under the file-access policy
(:mod:`parsers.file_policy`): a regular file of at most :data:`MAX_BYTES` that does not leave its own
folder through a symlink (a ``forensics.toml -> /proc/kmsg`` would never end), else an input error.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.errors import InputError
from parsers import file_policy

NAMES = ("forensics.toml", "pyproject.toml")
MAX_BYTES = 4 << 20
"""A settings file larger than this is not read (an input error)."""


@dataclass(frozen=True)
class UserConfig:
    """The settings found, and where."""

    path: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    step_key: str | None = None
    ignore: tuple[str, ...] = ()

    def as_meta(self) -> dict[str, Any]:
        """For ``meta["user_config"]``."""
        return {"path": self.path, "aliases": dict(self.aliases), "step_key": self.step_key,
                "ignore": list(self.ignore)}


def _table(path: Path) -> dict[str, Any] | None:
    try:  # the file-access policy: a regular file inside its own folder, never /proc or a FIFO, bounded
        data = tomllib.loads(file_policy.read_text(path, MAX_BYTES, root=path.parent, encoding="utf-8"))
    except file_policy.Refused as exc:
        raise InputError(path, f"not read: {exc.strerror}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"not valid TOML: {exc}") from None
    if path.name == "pyproject.toml":
        return data.get("tool", {}).get("forensics")
    return data


def find(run_dir: str | Path) -> UserConfig:
    """The user's settings for ``run_dir`` (empty when no file says anything).

    Raises:
        InputError: the nearest file does not parse, or its keys have the wrong types.
    """
    folder = Path(run_dir).expanduser().resolve()
    for d in (folder, *folder.parents):
        for name in NAMES:
            p = d / name
            if not p.is_file():
                continue
            t = _table(p)
            if t is None:
                continue
            return _validate(p, t)
    return UserConfig()


def _validate(path: Path, t: dict[str, Any]) -> UserConfig:
    aliases = t.get("aliases", {})
    step_key = t.get("step_key")
    ignore = t.get("ignore", [])
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise InputError(path, "aliases must be a table of strings, e.g. aliases = { loss = \"train/total\" }")
    if step_key is not None and not isinstance(step_key, str):
        raise InputError(path, "step_key must be a string")
    if not isinstance(ignore, list) or not all(isinstance(g, str) for g in ignore):
        raise InputError(path, "ignore must be a list of glob patterns")
    return UserConfig(path=str(path), aliases=dict(aliases), step_key=step_key, ignore=tuple(ignore))
