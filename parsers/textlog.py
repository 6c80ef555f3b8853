r"""Trainer stdout and text logs: Megatron-LM, DeepSpeed, HF, fairseq/metaseq, torchtitan, NeMo, nanoGPT, scripts.

Lines are split on ``\n`` and ``\r`` (tqdm), ANSI escapes and ``[rankN]:`` prefixes are removed,
then each line goes to the framework modules of :mod:`parsers.lines` in turn (Megatron, DeepSpeed,
fairseq/metaseq, HF stdout, torchtitan, NeMo, nanoGPT, generic), then to the framework-neutral ones
(checkpoints, resumes, errors). This module assembles what they return: segments, events, configuration dumps and diffs,
tracebacks, and the log-format traps of DESIGN.md section 4:

- a Megatron iteration line without ``lm loss`` when other lines have it is a NaN average loss:
  a ``loss = NaN`` row and a ``nan_detected`` event;
- fairseq's ``loss_scale=0`` is kept as logged, with ``meta["loss_scale_zero_means_small"]``;
- a metric printed as exactly 0 on every Megatron line (``grad norm: 0.000``) is a placeholder: its
  rows are dropped and listed in ``meta["placeholder_metrics"]``.

A new local segment starts at a (re)launch (``START TIME:``, an argument dump, ``***** Running
training *****``, a ``Namespace(...)``) after anything happened, at a checkpoint load or resume
line, and when the step goes back; several markers in a row open one segment only.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from forensics.schema import canonical_metric
from parsers._io import logical_name, logical_suffix, open_binary, open_text
from parsers.lines import (
    LineRecord,
    Rows,
    common,
    dedupe_canonical,
    deepspeed,
    fairseq,
    generic,
    hf_stdout,
    megatron,
    nanogpt,
    nemo,
    torchtitan,
)
from parsers.lines.pyrepr import flatten

FORMAT = "textlog"
HEAD_BYTES = 64 * 1024
_MODULES = (megatron, deepspeed, fairseq, hf_stdout, torchtitan, nemo, nanogpt, generic)
_LOG_NAMES = ("log", "stdout", "stderr", "output")
_PRECISION = {"megatron": "%.6E", "fairseq": "%.3f", "metaseq": "%.3f", "hf_trainer_stdout": "float64",
              "imagenet": "%.4f", "torchtitan": "%.4f", "nemo": "%.4g",
              "nanogpt": "%.4f"}
_QUIET_META = {"step_source", "value_format", "loss_scale_zero_means_small", "batches_per_epoch", "versions",
               "step_unit"}
_ERROR_KINDS = {"error", "hardware_error", "oom"}
_MAX_DAMAGED = 20
_TB = "Traceback (most recent call last)"
_TQDM = re.compile(r"^[^{|]{0,80}\d+%\|[^|]{0,200}\| *\d+/\d+ \[[^\]]*\]\s*$")


def _recognised(text: str) -> bool:
    state: dict = {}
    for line in text.replace("\r", "\n").split("\n")[:5000]:
        line = common.clean(line)
        for mod in _MODULES:
            r = mod.parse_line(line, state)
            if r is not None and (r.metrics or r.dump == "begin" or r.config):
                return True
    return False


def sniff(path: Path) -> bool:
    """True for text logs: ``*.log|out|err``, ``stdout*``, log-like ``*.txt``, or any text with a metric line.

    Never raises.
    """
    try:
        if not path.is_file():
            return False
        with open_binary(path) as fh:
            head = fh.read(HEAD_BYTES)
        if b"\0" in head:
            return False
        name, suffix = logical_name(path), logical_suffix(path)
        if suffix in (".log", ".out", ".err") or name.startswith(("stdout", "stderr")):
            return True
        text = head.decode("utf-8", errors="replace")
        if suffix == ".txt":
            return any(k in name for k in _LOG_NAMES) or _recognised(text)
        return suffix == "" and _recognised(text)
    except (OSError, ValueError, EOFError):
        return False


class _Assembler:
    """Turns line records into rows, events, segments and meta."""

    def __init__(self, rel: str) -> None:
        self.rows = Rows(rel)
        self.state: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.segment = 0
        self.seg_rows = 0
        self.last_step: int | None = None
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
        self.order = list(_MODULES)
        self.skipped: list[Skip] = []

    # -- segments and events -------------------------------------------------------------------
    def brk(self) -> None:
        if self.seg_rows:
            self.segment += 1
            self.seg_rows = 0
            self.last_step = None
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
        if r.metrics:
            self.metrics(r)

    def metrics(self, r: LineRecord) -> None:
        step = r.step if r.step is not None else self.any_step
        if step is None:
            return
        if r.step is not None and self.last_step is not None and r.step < self.last_step:
            self.brk()
        metrics = dedupe_canonical(r.metrics)
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
            self.last_step = step
        self.any_step = step
        self.activity = True
        self.launch_open = False
        self.block_kinds.clear()
        self.last_ckpt = None

    # -- one line --------------------------------------------------------------------------------
    def line(self, line: str, lineno: int) -> None:
        if self.tb is not None:
            if not line or line[0] in " \t" or line.startswith(("File ", "During handling", "The above")):
                return
            m = common.EXC_LINE.match(line.strip())
            self.tb = None
            if m:
                self.event(common.error_kind(line), line.strip()[:500], None)
                return
            self.event("error", f"line {lineno}: traceback without an exception line", None)
        if line.startswith(_TB) or line.endswith(_TB + ":"):  # after a tqdm bar drawn without a newline too
            self.end_dump(lineno)
            self.tb = []
            return
        if not line.strip() or (_TQDM.match(line) and "=" not in line):  # NeMo bars carry metrics after '='
            return
        for mod in self.order:
            r = mod.parse_line(line, self.state)
            if r is not None:
                if r.metrics and mod is not self.order[0]:  # the framework that logs metrics goes first
                    self.order.remove(mod)
                    self.order.insert(0, mod)
                self.record(r, lineno)
                return
        r = common.parse_line(line, self.state)
        if r is not None:
            self.record(r, lineno)
            return
        self.end_dump(lineno)
        if common.is_error_line(line):
            self.event(common.error_kind(line), line.strip()[:500], None)

    # -- end of file -----------------------------------------------------------------------------
    def finish(self, lineno: int) -> tuple[list[bool] | None, dict[str, Any]]:
        self.end_dump(lineno)
        if self.tb is not None:
            self.event("error", "traceback cut off at the end of the file", None)
        if any(has for _, _, has, _ in self.loss_lines):
            for seg, step, has, wall in self.loss_lines:
                if not has:
                    self.rows.add(seg, step, "loss", math.nan, "lm loss (absent: NaN average)", wall)
                    self.rows.event(seg, step, "nan_detected", "iteration line without 'lm loss': the "
                                    "averaged loss was NaN (Megatron omits it)")
                    self.meta["nan_loss_lines"] = self.meta.get("nan_loss_lines", 0) + 1
        if not self.state.get("fairseq_inner"):  # no inner lines: the epoch lines are the only series
            groups: dict[tuple[int, int], list[int]] = {}
            for i, name in enumerate(self.rows.metric):
                if name.startswith("epoch_avg/"):
                    groups.setdefault((self.rows.seg[i], self.rows.step[i]), []).append(i)
            for idx in groups.values():
                raw = [self.rows.metric[i].partition("/")[2] for i in idx]
                named = dedupe_canonical([(canonical_metric(t), t, None) for t in raw])
                for i, (name, _, _) in zip(idx, named, strict=True):
                    self.rows.metric[i] = name
        keep = None
        if self.frameworks.get("megatron"):
            for name in ("grad_norm", "param_norm"):
                vals = [v for n, v in zip(self.rows.metric, self.rows.value, strict=True) if n == name]
                if len(vals) >= 3 and all(v == 0.0 for v in vals):
                    keep = keep or [True] * len(self.rows)
                    for i, n in enumerate(self.rows.metric):
                        if n == name:
                            keep[i] = False
                    self.meta.setdefault("placeholder_metrics", {})[name] = (
                        "printed as 0 on every line: a placeholder, not a measurement; rows dropped")
        if self.frameworks.get("megatron") and self.meta.get("precision") == "bf16":
            scales = [v for n, v in zip(self.rows.metric, self.rows.value, strict=True) if n == "loss_scale"]
            if scales and all(v == 1.0 for v in scales):
                keep = keep or [True] * len(self.rows)
                for i, n in enumerate(self.rows.metric):
                    if n == "loss_scale":
                        keep[i] = False
                self.meta.setdefault("placeholder_metrics", {})["loss_scale"] = (
                    "constant 1.0 in a bf16 run (no loss scaler); rows dropped")
        fw = self.frameworks.most_common(1)[0][0] if self.frameworks else "generic"
        self.meta["framework"] = fw
        self.meta["frameworks"] = sorted(self.frameworks)
        if len(self.history) > 1:
            self.meta["args_history"] = self.history
        self.meta["lines"] = lineno
        self.meta["segments"] = self.segment + 1
        return keep, self.meta


def _both_nan(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


def read(path: Path, root: Path) -> ParseResult:
    """Read one text log.

    Args:
        path: The log file.
        root: The run folder; ``source`` and ``Skip.what`` are relative to it.

    Returns:
        A :class:`ParseResult`: metrics with canonical names and the logged tag, events (restart,
        checkpoint_loaded/saved, overflow_skip, loss_scale_change, nan_detected, error,
        hardware_error, oom, config, data_skip, job_end), ``meta["framework"]`` and the
        configuration found; an unterminated last line is skipped and reported.
    """
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    skipped: list[Skip] = []
    asm = _Assembler(rel)
    lineno = 1
    pending: str | None = None
    try:
        with open_text(path) as fh:  # splits on \n, \r\n, \r; .gz read transparently
            for piece in fh:
                if pending is not None:
                    asm.line(common.clean(pending), lineno)
                    lineno += pending.endswith("\n")
                pending = piece
    except (OSError, EOFError) as exc:
        if lineno == 1 and pending is None:
            raise ParseError(rel, f"unreadable: {exc.strerror or exc}") from None
        why = f"unreadable from here on ({exc.strerror or exc}); earlier lines kept"
        skipped.append(Skip(f"{rel}:{lineno}", why))
    if pending is not None:
        if pending.endswith(("\n", "\r")):
            asm.line(common.clean(pending), lineno)
            lineno += pending.endswith("\n")
        elif pending.strip():
            skipped.append(Skip(f"{rel}:{lineno}", "unterminated last line (the writer was killed mid-line); "
                                                   "not parsed"))
    lines = lineno - 1
    keep, meta = asm.finish(lines)
    skipped[:0] = asm.skipped
    precision = meta.get("value_format") or _PRECISION.get(meta["framework"], "text")
    return ParseResult(format=FORMAT, path=rel, metrics=asm.rows.metrics_table(keep),
                       events=asm.rows.events_table(), meta=meta, skipped=tuple(skipped), precision=precision)
