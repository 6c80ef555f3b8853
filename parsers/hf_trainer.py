"""Hugging Face Trainer ``trainer_state.json`` (``log_history``), docs/formats.md#hf-trainer-state.

Rows: train entries (``loss``, ``grad_norm``, ``learning_rate`` -> ``lr``, ``epoch``,
``num_input_tokens_seen`` -> ``tokens`` and any custom key such as ``logits_max``), eval entries
(``eval_loss`` and every ``eval_*`` under its name), both at their ``step``. The end-of-training
summary (``train_runtime``, ``train_loss``, ...) is not a metric row (its ``train_loss`` is a mean
over the run, not a ``loss`` sample): it goes to ``meta["train_summary"]``. NaN/Infinity tokens
are read by the stdlib ``json``.

Every checkpoint holds a copy of the history up to its step, so only the newest copy is read:
``read`` of a ``trainer_state.json`` whose sibling copies (``checkpoint-*/`` under the same output
folder, and the ``trainer_state.json`` of that folder itself) include one with a larger
``global_step`` returns no rows and ``meta["superseded_by"]`` (rows of the older copy beyond the
newest copy's last step, which cannot happen normally, are kept).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from parsers import file_policy
from parsers.lines import Rows, metric

FORMAT = "hf_trainer"
NAME = "trainer_state.json"
MAX_BYTES = 256 << 20
"""A copy of trainer_state.json larger than this is not read (a long run's is a few MB)."""
_CKPT = re.compile(r"^checkpoint-(\d+)$")
_SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                 "total_flos"}
_NOT_METRICS = {"step", "total_flos"}
_META_KEYS = ("global_step", "max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size",
              "num_train_epochs", "epoch", "num_input_tokens_seen", "total_flos", "best_metric",
              "best_model_checkpoint", "best_global_step", "is_hyper_param_search", "trial_name")


def sniff(path: Path) -> bool:
    """True for a file named ``trainer_state.json`` (never raises)."""
    try:
        return path.name == NAME and path.is_file()
    except OSError:
        return False


def _load(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(file_policy.read_text(path, MAX_BYTES))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _salvage(path: Path) -> tuple[dict[str, Any], int, str] | None:
    """A damaged file's usable part: ``(state, byte offset of the damage, what it is)``, or ``None``.

    A complete document followed by other bytes is kept whole; a cut or corrupt one keeps the complete
    ``log_history`` entries before the damage (the keys after ``log_history`` are lost).
    """
    try:
        text = path.read_text(encoding="utf-8-sig", errors="replace")
    except OSError:
        return None
    dec = json.JSONDecoder()
    try:
        d, i = dec.raw_decode(text, len(text) - len(text.lstrip()))
        if isinstance(d, dict):
            return d, len(text[:i].encode()), "bytes after the JSON document ignored"
    except ValueError:
        pass
    m = re.search(r'"log_history"\s*:\s*\[', text)
    if m is None:
        return None
    entries, i = [], m.end()
    while True:
        i += len(text[i:]) - len(text[i:].lstrip())
        try:
            entry, i = dec.raw_decode(text, i)
        except ValueError:
            break
        entries.append(entry)
        i += len(text[i:]) - len(text[i:].lstrip())
        if text[i:i + 1] != ",":
            break
        i += 1
    why = f"cut or corrupt JSON: the {len(entries)} complete log_history entries before this point kept"
    return {"log_history": entries}, len(text[:i].encode()), why


def _order(path: Path, state: dict[str, Any] | None) -> tuple[float, int]:
    """Rank of a copy: its ``global_step`` (else ``checkpoint-N``, else its last logged step)."""
    if state is not None:
        gs = state.get("global_step")
        if isinstance(gs, (int, float)) and not isinstance(gs, bool):
            return float(gs), 1 if not _CKPT.match(path.parent.name) else 0
        steps = [e.get("step") for e in state.get("log_history") or [] if isinstance(e, dict)]
        steps = [s for s in steps if isinstance(s, (int, float)) and not isinstance(s, bool)]
        if steps:
            return float(max(steps)), 0
    m = _CKPT.match(path.parent.name)
    return (float(m.group(1)) if m else -math.inf), 0


def _copies(path: Path) -> list[Path]:
    """Every copy of the state of the same training output folder, ``path`` included."""
    out_dir = path.parent.parent if _CKPT.match(path.parent.name) else path.parent
    found = [out_dir / NAME] if file_policy.is_readable_file(out_dir / NAME) else []
    try:  # a FIFO, a device or a link out of the run named trainer_state.json is never opened
        found += [d / NAME for d in out_dir.iterdir() if _CKPT.match(d.name) and file_policy.is_readable_file(d / NAME)]
    except OSError:
        pass
    return found if path in found else [*found, path]


def _newest(path: Path, state: dict[str, Any]) -> tuple[Path, float] | None:
    """The copy that supersedes ``path`` (larger ``global_step``), with its last logged step, or ``None``."""
    mine = _order(path, state)
    best: tuple[tuple[float, int], Path, dict[str, Any]] | None = None
    for other in _copies(path):
        if other == path:
            continue
        st = _load(other)
        if st is None:
            continue
        rank = _order(other, st)
        if rank > mine and (best is None or rank > best[0]):
            best = (rank, other, st)
    if best is None:
        return None
    steps = [e.get("step") for e in best[2].get("log_history") or [] if isinstance(e, dict)]
    nums = [s for s in steps if isinstance(s, (int, float)) and not isinstance(s, bool)]
    last = max(nums, default=-math.inf)
    return best[1], float(last)


def _value(v: Any) -> tuple[bool, float | None]:
    if v is None:
        return True, None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False, None
    return True, float(v)


def read(path: Path, root: Path) -> ParseResult:
    """Read the ``log_history`` of one ``trainer_state.json``.

    Args:
        path: The file.
        root: The run folder; ``source`` is relative to it.

    Returns:
        A :class:`ParseResult` with train and eval rows (local segments: a new one when the step
        goes back), ``meta`` with the state's scalars (``global_step``, ``max_steps``,
        ``logging_steps``, ...), ``train_summary`` and, for a superseded copy, ``superseded_by``.

    Raises:
        ParseError: The file is not JSON or has no ``log_history`` list.
    """
    rel = file_policy.rel(path, root)
    state = _load(path)
    skipped: list[Skip] = []
    if state is None and (found := _salvage(path)) is not None:
        state, at, why = found
        skipped.append(Skip(f"{rel}:{at}", why))
    if state is None or not isinstance(state.get("log_history"), list):
        raise ParseError(rel, "not a trainer_state.json: invalid JSON or no log_history list")
    meta: dict[str, Any] = {k: state[k] for k in _META_KEYS if k in state}
    meta["framework"] = "hf_trainer"
    rows = Rows(rel)
    newest = _newest(path, state)
    beyond = -math.inf
    if newest is not None:
        other, beyond = newest
        meta["superseded_by"] = (other.relative_to(root).as_posix() if other.is_relative_to(root)
                                 else str(other))
    rounded = _log_rows(state["log_history"], rel, rows, meta, skipped, beyond)
    precision = "%.4f" if rounded and all(rounded) else "float64"
    return ParseResult(format=FORMAT, path=rel, metrics=rows.metrics_table(), events=rows.events_table(),
                       meta=meta, skipped=tuple(skipped), precision=precision)


def _log_rows(history: list, rel: str, rows: Rows, meta: dict[str, Any], skipped: list[Skip],
              beyond: float) -> list[bool]:
    """Add the train and eval rows of ``log_history`` to ``rows`` (steps at or below ``beyond`` left out).

    Sets ``meta["segments"]`` and ``meta["train_summary"]``; returns, per finite loss, whether it is
    rounded to 4 decimals (the Trainer's ``%.4f`` logging).
    """
    segment, last = 0, None
    rounded = []
    for i, entry in enumerate(history):
        if not isinstance(entry, dict):
            skipped.append(Skip(f"{rel}:log_history[{i}]", "entry is not an object"))
            continue
        step = entry.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not -(1 << 63) <= step < 1 << 63:
            skipped.append(Skip(f"{rel}:log_history[{i}]", "entry without a numeric step"))
            continue
        step = int(step)
        is_eval = any(k.startswith("eval_") for k in entry)
        if _SUMMARY_KEYS & entry.keys() and "loss" not in entry and not is_eval:
            meta["train_summary"] = entry
            continue
        if step <= beyond:
            continue
        if last is not None and step < last:
            segment += 1
        last = step
        for key, v in entry.items():
            if key in _NOT_METRICS or (is_eval and key == "epoch"):
                continue
            ok, x = _value(v)
            if not ok:
                continue
            name, tag, _ = metric(key, x)
            rows.add(segment, step, name, x, tag)
            if name == "loss" and x is not None and math.isfinite(x):
                rounded.append(round(x, 4) == x)
    meta["segments"] = segment + 1
    return rounded
