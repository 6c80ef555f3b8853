"""Replay a finished run into a folder step by step, as its writers wrote it (tests, lead-time benchmark).

:func:`plan` splits every file of a run folder into pieces keyed by the training step they belong to,
and :func:`replay` appends them to a destination folder in step order at a fixed rate:

- JSONL: each line, at its ``step`` (``_step``, ``global_step``, ``iteration`` ...);
- text logs: each line, at the step it names (``step N``, ``iteration N``, ``it N``); a line that
  names none goes with the line before it (checkpoint, resume and error lines stay where they were);
- TensorBoard event files: each TFRecord frame, at the ``step`` field of its Event (frames without
  one, like the file-version header, go first);
- checkpoint folders named ``step_N``, ``checkpoint-N``, ``global_stepN``: copied whole at step N;
- other files (configs, notes): copied before the first step. ``expected.json`` (ground truth) is
  never copied.

Bytes are written exactly as in the source, so the replayed folder ends byte-identical to it.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_STEP_KEYS = ("step", "_step", "global_step", "iteration", "iter", "train/global_step")
_TEXT_STEP = re.compile(r"\b(?:step|iteration|iter|it|global_step)[\s:=#]*(\d+)", re.I)
_CKPT_DIR = re.compile(r"^(?:step|checkpoint|ckpt|global_step|iter)[-_]?(\d+)$", re.I)
_NEVER = ("expected.json",)


@dataclass(frozen=True)
class Piece:
    """Bytes to append to ``rel`` (or a folder to copy when ``folder``) at ``step`` of ``segment``."""

    step: int
    rel: str
    data: bytes = b""
    folder: bool = False
    segment: int = 0


def _varint(b: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while i < len(b):
        c = b[i]
        result |= (c & 0x7F) << shift
        i += 1
        if not c & 0x80:
            return result, i
        shift += 7
    raise ValueError("truncated varint")


def _event_step(payload: bytes) -> int | None:
    """The ``step`` (field 2, varint) of a serialized ``tensorflow.Event``, None when absent."""
    i = 0
    try:
        while i < len(payload):
            key, i = _varint(payload, i)
            field, wire = key >> 3, key & 7
            if wire == 0:
                v, i = _varint(payload, i)
                if field == 2:
                    return v
            elif wire == 1:
                i += 8
            elif wire == 2:
                n, i = _varint(payload, i)
                i += n
            elif wire == 5:
                i += 4
            else:
                return None
    except ValueError:
        return None
    return None


def _tb_pieces(rel: str, data: bytes) -> list[Piece]:
    out, pos, step = [], 0, -1
    while pos + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[pos:pos + 8])
        end = pos + 12 + n + 4
        if end > len(data):
            break
        s = _event_step(data[pos + 12:pos + 12 + n])
        step = max(step, s) if s is not None else step
        out.append(Piece(step if s is not None else max(step, -1), rel, data[pos:end]))
        pos = end
    if pos < len(data):
        out.append(Piece(step, rel, data[pos:]))
    return out


def _line_pieces(rel: str, data: bytes, jsonl: bool) -> list[Piece]:
    out, step = [], -1
    for line in data.splitlines(keepends=True):
        s = None
        if jsonl:
            try:
                obj = json.loads(line)
                if isinstance(obj, dict):
                    s = next((int(obj[k]) for k in _STEP_KEYS if isinstance(obj.get(k), (int, float))), None)
            except ValueError:
                s = None
        else:
            m = _TEXT_STEP.search(line.decode("utf-8", "replace"))
            s = int(m.group(1)) if m else None
        if s is not None:
            step = s
        out.append(Piece(step, rel, line))
    return out


def _segmented(pieces: list[Piece], base: int = 0) -> tuple[list[Piece], int, int]:
    """Pieces with their segment (a step strictly below the previous one starts a new one: a resume).

    Returns:
        ``(pieces, last segment, last step)``.
    """
    out, seg, last = [], base, -1
    for p in pieces:
        if p.step >= 0:
            if p.step < last:
                seg += 1
            last = p.step
        out.append(Piece(p.step, p.rel, p.data, p.folder, seg))
    return out, seg, last


def plan(src: Path) -> list[Piece]:
    """Every piece of the run at ``src``, in the order to write them: by (segment, step), stable.

    Segments keep restarts in order: within a file a step that goes back starts a new segment, and
    a TensorBoard file whose first step is below the last step of the folder's previous event file
    (a resumed process) starts one too.
    """
    pieces: list[tuple[int, int, int, Piece]] = []
    n = 0
    tb_state: dict[str, tuple[int, int]] = {}  # folder -> (segment, last step) of its last event file
    ckpt_roots: list[Path] = []
    for p in sorted(src.rglob("*")):
        if any(p.is_relative_to(c) for c in ckpt_roots):
            continue
        rel = p.relative_to(src).as_posix()
        if p.is_dir():
            m = _CKPT_DIR.match(p.name)
            if m:
                ckpt_roots.append(p)
                pieces.append((int(m.group(1)), n, Piece(int(m.group(1)), rel, folder=True)))
                n += 1
            continue
        if p.name in _NEVER or not p.is_file():
            continue
        data = p.read_bytes()
        name = p.name.lower()
        if "tfevents" in name:
            folder = rel.rpartition("/")[0]
            seg0, last0 = tb_state.get(folder, (0, -1))
            got = _tb_pieces(rel, data)
            first = next((p.step for p in got if p.step >= 0), None)
            base = seg0 + 1 if first is not None and first < last0 else seg0
            got, seg, last = _segmented(got, base)
            tb_state[folder] = (seg, last)
        elif name.endswith((".jsonl", ".ndjson")):
            got, _, _ = _segmented(_line_pieces(rel, data, True))
        elif name.endswith((".log", ".txt", ".out")) or name in ("stdout", "stderr"):
            got, _, _ = _segmented(_line_pieces(rel, data, False))
        else:
            got = [Piece(-1, rel, data)]
        for piece in got:
            pieces.append((piece.segment, piece.step, n, piece))
            n += 1
    pieces.sort(key=lambda t: (t[0], t[1], t[2]))
    return [p for *_, p in pieces]


def steps_of(pieces: list[Piece]) -> list[tuple[int, int]]:
    """The distinct (segment, step) of a plan, in order (step -1 = before the segment's first step)."""
    return sorted({(p.segment, p.step) for p in pieces})


def write_until(pieces: list[Piece], src: Path, dst: Path, start: int, until: tuple[int, int]) -> int:
    """Append ``pieces[start:]`` up to and including (segment, step) ``until``; returns the next index."""
    handles: dict[str, object] = {}
    i = start
    try:
        while i < len(pieces) and (pieces[i].segment, pieces[i].step) <= until:
            p = pieces[i]
            target = dst / p.rel
            if p.folder:
                shutil.copytree(src / p.rel, target, dirs_exist_ok=True)
            else:
                fh = handles.get(p.rel)
                if fh is None:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    fh = handles[p.rel] = open(target, "ab")  # noqa: SIM115 - closed below
                fh.write(p.data)  # type: ignore[attr-defined]
            i += 1
    finally:
        for fh in handles.values():
            fh.close()  # type: ignore[attr-defined]
    return i


def replay(src: Path, dst: Path, *, steps_per_tick: int = 1, tick_s: float = 0.05,
           on_tick: Callable[[int], None] | None = None, stop_at: Callable[[], bool] | None = None) -> int:
    """Write the run at ``src`` into ``dst`` ``steps_per_tick`` steps every ``tick_s`` seconds.

    Returns:
        The last step written (the whole run unless ``stop_at()`` turned true first).
    """
    pieces = plan(src)
    dst.mkdir(parents=True, exist_ok=True)
    steps = steps_of(pieces)
    i, last = 0, -1
    for k in range(0, len(steps), max(1, steps_per_tick)):
        t0 = time.monotonic()
        until = steps[min(len(steps) - 1, k + steps_per_tick - 1)]
        last = until[1]
        i = write_until(pieces, src, dst, i, until)
        if on_tick:
            on_tick(last)
        if stop_at and stop_at():
            break
        time.sleep(max(0.0, tick_s - (time.monotonic() - t0)))
    return last
