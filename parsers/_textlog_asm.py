"""The text reader's assembler: line records become rows, events, segments, configuration and meta.

One :class:`Assembler` per file. :meth:`Assembler.line` sends a cleaned line through the framework
modules of :mod:`parsers.lines` in turn (the one that logs metrics first), then the general reader
:mod:`parsers.lines.kv`, then the framework-neutral rules (checkpoints, resumes, errors), and keeps
what the record says (:meth:`Assembler.record`). A new local segment starts at a (re)launch after
anything happened, at a checkpoint load or resume line, and when a counter's step goes back
(:func:`counter`); tracebacks, argument dumps and configuration diffs are followed across lines.
Lines read in bulk come through :mod:`parsers._textlog_bulk` with the same rules.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from forensics.model import Skip
from parsers import _textlog_finish
from parsers.lines import (
    LineRecord,
    Rows,
    common,
    dedupe_canonical,
    deepspeed,
    fairseq,
    generic,
    hf_stdout,
    json_inline,
    kv,
    megatron,
    nanogpt,
    nemo,
    torchtitan,
    tqdm_bar,
)
from parsers.lines.kv_bulk import SIG_SEP
from parsers.lines.pyrepr import flatten
from parsers.rank_files import RankValues

MODULES = (megatron, deepspeed, fairseq, hf_stdout, torchtitan, nemo, tqdm_bar, nanogpt, generic, json_inline,
           kv)
_TRAPS = MODULES[:-1]  # the framework modules, each kept for a trap; kv (the general reader) always goes last
_QUIET_META = {"step_source", "value_format", "loss_scale_zero_means_small", "batches_per_epoch", "versions",
               "step_unit"}
_ERROR_KINDS = {"error", "hardware_error", "oom"}
_MAX_DAMAGED = 20
_TB = "Traceback (most recent call last)"
_BAR = re.compile(r"\d%\|")
_TRACEBACK = object()  # asm.line's answer for a line inside a traceback
STEP_HEADER = object()  # asm.line's answer for a step header (never bulk-read: each one sets the step)
_TQDM = re.compile(r"^[^{|]{0,80}\d+%\|[^|]{0,200}\| *\d+/\d+ \[[^\]]*\]\s*$")


class Assembler:
    """Turns line records into rows, events, segments and meta."""

    def __init__(self, rel: str) -> None:
        self.rows = Rows(rel)
        self.unmerged = 0  # bulk chunks added since the last merge (parsers._textlog_bulk.MERGE)
        self.state: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.segment = 0
        self.seg_rows = 0
        self.last: dict[tuple[int | None, str, str], int] = {}  # (rank, framework, line keys) -> step
        self.finer = False  # a metric line with a step that is not its epoch was seen
        self.any_step: int | None = None
        self.activity = False
        self.launch_open = False
        self.block_kinds: set[str] = set()
        self.last_ckpt: tuple[str, int | None] | None = None
        self.dump: dict[str, Any] | None = None
        self.dump_ns = "args"
        self.configs: dict[str, dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self.frameworks: Counter[str] = Counter()
        self.agg: dict[tuple[int, int, str], int] = {}
        self.loss_lines: list[tuple[int, int, bool, float | None]] = []
        self.scale: float | None = None
        self.tb: list[str] | None = None
        self.order = list(MODULES)
        self.skipped: list[Skip] = []
        self.skip_counts: Counter[str] = Counter()
        self.rank: int | None = None
        self.hint: tuple[bool, bool] | None = None  # (may be a general metric line, may be an event line)
        self.ranks: Counter[int] = Counter()
        self.rank_seen: set[tuple[int, int, str]] = set()
        self.rank_values = RankValues()  # each rank's own values of the compared series (RK01)
        self.index_steps: int | None = None  # a running index for step-less lines (parsers.textlog: no step at all)
        self.hf_dicts: list[tuple] = []  # HF dict lines: (lineno, epoch, precision, eval, bar n, bar total, seg, rows)
        self.bars: list[tuple] = []  # tqdm bars after the first HF dict: (lineno, count, total) arrays per block

    # -- segments and events -------------------------------------------------------------------
    def brk(self) -> None:
        if self.seg_rows:
            self.segment += 1
            self.seg_rows = 0
            self.last = {}
            self.scale = None

    def event(self, kind: str, message: str, step: int | None) -> None:
        step = self.any_step if step is None else step
        if kind.startswith("checkpoint_"):
            if self.last_ckpt is not None and self.last_ckpt[0] == kind and self.last_ckpt[1] == step:
                return
            self.last_ckpt = (kind, step)
        if kind in _ERROR_KINDS:
            if kind in self.block_kinds:
                return
            self.block_kinds.add(kind)
        self.rows.event(self.segment, step, kind, message)
        if kind == "checkpoint_loaded" and step is not None and not len(self.rows):
            self.meta.setdefault("resumed_from_step", step)
        if kind != "config":
            self.activity = True
        if kind in _ERROR_KINDS:
            self.launch_open = False

    # -- configuration ---------------------------------------------------------------------------
    def config(self, ns: str, cfg: dict[str, Any], lineno: int) -> None:
        flat = flatten(cfg)
        prev = self.configs.get(ns)
        if prev is not None:
            changed = [f"{k}: {prev.get(k)!r} -> {flat.get(k)!r}" for k in sorted(set(prev) | set(flat))
                       if prev.get(k) != flat.get(k) and not _both_nan(prev.get(k), flat.get(k))]
            if changed:
                more = f" (+{len(changed) - 12} more)" if len(changed) > 12 else ""
                self.event("config", f"{ns} changed: " + "; ".join(changed[:12]) + more, None)
        self.configs[ns] = flat
        key = "deepspeed_config" if ns == "deepspeed" else "args"
        self.meta[key] = cfg
        self.history.append({"line": lineno, "segment": self.segment, "namespace": ns, "config": cfg})
        if ns != "deepspeed" and "precision" not in self.meta:
            for flag, prec in (("bf16", "bf16"), ("fp16", "fp16")):
                if cfg.get(flag) is True:
                    self.meta["precision"] = prec
                    break

    def end_dump(self, lineno: int) -> None:
        if self.dump is not None:
            d, self.dump = self.dump, None
            self.config(self.dump_ns, d, lineno)

    def set_meta(self, meta: dict[str, Any]) -> None:
        for k, v in meta.items():
            if k == "versions":
                self.meta.setdefault("versions", {}).update(v)
                continue
            old = self.meta.get(k)
            if k in self.meta and old != v and k not in _QUIET_META:
                self.event("config", f"{k}: {old!r} -> {v!r}", None)
            self.meta[k] = v

    # -- one record ------------------------------------------------------------------------------
    def record(self, r: LineRecord, lineno: int) -> None:
        if r.damaged is not None:
            if len(self.skipped) < _MAX_DAMAGED:
                self.skipped.append(Skip(f"{self.rows.source}:{lineno}", r.damaged))
            elif len(self.skipped) == _MAX_DAMAGED:
                self.skipped.append(Skip(f"{self.rows.source}:{lineno}", "more damaged lines from here on, "
                                                                           "not listed one by one"))
            return
        if self.dump is not None and r.arg is None and r.dump != "end":
            self.end_dump(lineno)
        if r.dump == "begin":
            self.dump, self.dump_ns = {}, r.ns
        if r.arg is not None:
            if self.dump is None:
                self.dump, self.dump_ns = {}, r.ns
            self.dump[r.arg[0]] = r.arg[1]
        if r.dump == "end":
            self.end_dump(lineno)
        if r.launch and not self.launch_open:
            self.launch_open = True
            if self.activity:
                self.brk()
                self.event("restart", f"line {lineno}: the program was started again", None)
            self.block_kinds.clear()
            self.last_ckpt = None
        if r.config is not None:
            self.config(r.ns, r.config, lineno)
        if r.meta:
            self.set_meta(r.meta)
        if r.summary is not None:
            self.meta["train_summary"] = r.summary
        if r.resume:
            self.brk()
            if r.step is not None:
                self.any_step = r.step
        for kind, msg, step in r.events:
            self.event(kind, msg, step)
        if r.metrics and r.bar_pos is not None and r.meta.get("step_source") not in ("logged", "epoch"):
            # an HF dict numbered by a running index: dated by the tqdm bars at the end of the file
            first = len(self.rows.step)
            self.metrics(r)
            e, q, n, t = r.bar_pos
            self.hf_dicts.append((lineno, e, q, r.eval, n, t, self.segment, first, len(self.rows.step)))
        elif r.metrics:
            self.metrics(r)

    def rank_rows(self, step: int, metrics: list) -> list:
        """The metrics of a rank-prefixed line that no rank logged yet at this (segment, step).

        Interleaved ranks (``[rank3]:``, ``3: ``) are one run: a value that several ranks print is kept
        once (the first rank's), a step that only one rank printed is kept, and the rank is counted in
        ``meta["ranks"]``; a rank's step never goes back because another rank is behind.
        """
        if self.rank is None:
            return metrics
        self.ranks[self.rank] += 1
        out = []
        self.rank_values.add(self.rank, self.segment, step, metrics)
        for m in metrics:
            key = (self.segment, step, m[0])
            if key not in self.rank_seen:
                self.rank_seen.add(key)
                out.append(m)
        if len(out) < len(metrics):
            self.skip_counts["values another rank already logged"] += len(metrics) - len(out)
        return out

    def header(self, step: int) -> None:
        """A line that holds only a step (``epoch   1``, ``Step 100/1000``): the step of the lines below it."""
        ctr = ("generic", "\x00header")
        if self.went_back(step, ctr) and self.seg_rows:
            self.brk()
        self.set_last(step, ctr)
        self.any_step = step

    def went_back(self, step: int, counter: tuple[str, str]) -> bool:
        """True when a counter's step goes back (a restart).

        A counter is one rank's step as one kind of line prints it: a framework module's lines, or the
        general reader's lines with one set of keys (:func:`counter`). A step below another
        kind of line's step (DeepSpeed's ``step=10`` among PPO's ``step: 9``) is not a restart.
        """
        last = self.last.get((self.rank, *counter))
        return last is not None and step < last

    def set_last(self, step: int, counter: tuple[str, str]) -> None:
        self.last[(self.rank, *counter)] = step

    def metrics(self, r: LineRecord) -> None:
        if r.framework == "generic" and r.epoch is not None and self.finer:
            r.step = None  # an epoch-indexed line among finer steps belongs to the last step seen
        elif r.step is not None and not (r.framework == "generic" and r.epoch is not None):
            self.finer = True
        step = r.step if r.step is not None else self.any_step
        if r.step is None and self.index_steps is not None:  # no step in the whole file: the running index
            self.index_steps += 1
            step = self.index_steps
            self.meta["step_axis"] = {"column": "running index of the step-less metric lines (none has a step)",
                                      "kind": "row_index"}
        if step is None:
            self.skip_counts["metric line before any step"] += 1
            return
        ctr = counter(r.framework, r.metrics)
        if r.step is not None and self.went_back(r.step, ctr):
            self.brk()
        metrics = self.rank_rows(step, dedupe_canonical(r.metrics))
        if not metrics:
            return
        if r.agg_last:
            for name, tag, value in metrics:
                key = (self.segment, step, name)
                if key in self.agg:
                    self.rows.set_value(self.agg[key], value, r.wall_time)
                else:
                    self.agg[key] = self.rows.add(self.segment, step, name, value, tag, r.wall_time)
        else:
            self.rows.extend(self.segment, step, metrics, r.wall_time)
        if r.framework == "megatron":
            value = next((v for n, _, v in metrics if n == "loss_scale"), None)
            if value is not None:
                if self.scale is not None and value != self.scale:
                    self.event("loss_scale_change", f"loss scale {self.scale:g} -> {value:g}", step)
                self.scale = value
        self.frameworks[r.framework] += len(r.metrics)
        self.seg_rows += len(r.metrics)
        if r.has_loss is not None:
            self.loss_lines.append((self.segment, step, r.has_loss, r.wall_time))
        if r.step is not None:
            self.set_last(step, ctr)
        self.any_step = step
        self.activity = True
        self.launch_open = False
        self.block_kinds.clear()
        self.last_ckpt = None

    def line(self, line: str, lineno: int) -> Any:
        """Handle one cleaned line; returns the module that read it (``None``: nobody, or inside a traceback)."""
        if self.tb is not None:
            if not line or line[0] in " \t" or line.startswith(("File ", "During handling", "The above")):
                self.skip_counts["traceback"] += 1
                return _TRACEBACK
            m = common.EXC_LINE.match(line.strip())
            self.tb = None
            if m:
                self.event(common.error_kind(line), line.strip()[:500], None)
                return _TRACEBACK
            self.event("error", f"line {lineno}: traceback without an exception line", None)
        if line.startswith(_TB) or line.endswith(_TB + ":"):  # after a tqdm bar drawn without a newline too
            self.end_dump(lineno)
            self.tb = []
            return _TRACEBACK
        if not line.strip() or (_TQDM.match(line) and "=" not in line):  # NeMo bars carry metrics after '='
            self.skip_counts["blank or progress bar"] += 1
            return None
        for mod in self.order:
            if mod is kv:
                if "%|" in line and _BAR.search(line):  # a progress bar repeats stale values: the NeMo
                    break                                  # module's trap; a bar it refused is not read
                r = kv.parse_line(line, self.state) if self.hint is None or self.hint[0] else None
                if r is None:
                    break
                c = common.parse_line(line, self.state, nan_text=False)
                if c is not None:  # checkpoint, resume, configuration and job-end lines are events
                    self.record(c, lineno)
                    return common
                if not r.metrics:  # a step header: the step-less metric lines below it belong to its step
                    self.header(r.step)
                    return STEP_HEADER
                self.record(r, lineno)
                return kv
            r = mod.parse_line(line, self.state)
            if r is not None:
                if r.metrics and mod is not self.order[0] and mod is not kv:  # the framework that logs
                    self.order.remove(mod)                                     # metrics goes first; the
                    self.order.insert(0, mod)                                  # general reader stays last
                self.record(r, lineno)
                return mod
        if self.hint is not None and not self.hint[1]:  # the block's scan says: no event, no error
            self.end_dump(lineno)
            return None
        r = common.parse_line(line, self.state)
        if r is not None:
            self.record(r, lineno)
            return common
        self.end_dump(lineno)
        if common.is_error_line(line):
            self.event(common.error_kind(line), line.strip()[:500], None)
        return None

    # -- end of file -----------------------------------------------------------------------------

    # -- end of file -----------------------------------------------------------------------------
    def finish(self, lineno: int) -> tuple[list[bool] | None, dict[str, Any]]:
        """Close what is open and apply the end-of-file traps; returns ``(rows to keep or None, meta)``."""
        if self.hf_dicts:  # HF Trainer dicts: their global steps from the tqdm bars around them
            _textlog_finish.date_hf_dicts(self)
        return _textlog_finish.finish(self, lineno)


def counter(framework: str, metrics: list) -> tuple[str, str]:
    """Which counter a metric line's step belongs to (a restart is judged per counter).

    The framework modules read a trainer's own step lines: one counter for all of them (a file whose
    torchtitan lines are followed by NeMo lines at a lower step holds two launches). The general
    reader's lines are a counter per set of keys: a script's ``epoch: 0|step: 9|act_loss: ...`` and
    the library's ``step=10, skipped=4`` beside it count different things.
    """
    if framework != "generic":
        return "module", ""
    return framework, SIG_SEP.join(t for _, t, _ in metrics)


def _both_nan(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


