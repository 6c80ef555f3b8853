r"""Trainer stdout and text logs: Megatron-LM, DeepSpeed, HF, fairseq/metaseq, torchtitan, NeMo, nanoGPT, scripts.

Lines are split on ``\n`` and ``\r`` (tqdm) and read in blocks of 65,536: ANSI escapes and rank prefixes
(``[rankN]:``, ``N: ``, kept as the line's rank) are removed with polars; a line that may be a metric line
is reduced to its shape, and the first line of each shape goes to the framework modules of
:mod:`parsers.lines` in turn (Megatron, DeepSpeed, fairseq/metaseq, HF stdout, torchtitan, NeMo, nanoGPT,
the ImageNet/non-finite traps), then to the general reader :mod:`parsers.lines.kv`, then to the
framework-neutral rules (checkpoints, resumes, errors). Every later line of a shape the general reader
took is read in bulk (:class:`_Reader`); printed script source is skipped and counted. This module
assembles what they return: segments, events, configuration dumps and diffs,
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

import numpy as np
import polars as pl
import pyarrow as pa

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from forensics.schema import METRICS_SCHEMA, canonical_metric
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
    kv,
    kv_bulk,
    megatron,
    nanogpt,
    nemo,
    repeat_string,
    torchtitan,
)
from parsers.lines.kv_bulk import SIG_SEP
from parsers.lines.pyrepr import flatten

FORMAT = "textlog"
HEAD_BYTES = 64 * 1024
_MODULES = (megatron, deepspeed, fairseq, hf_stdout, torchtitan, nemo, nanogpt, generic, kv)
_TRAPS = _MODULES[:-1]  # the framework modules, each kept for a trap; kv (the general reader) always goes last
_LOG_NAMES = ("log", "stdout", "stderr", "output")
_PRECISION = {"megatron": "%.6E", "fairseq": "%.3f", "metaseq": "%.3f", "hf_trainer_stdout": "float64",
              "imagenet": "%.4f", "torchtitan": "%.4f", "nemo": "%.4g",
              "nanogpt": "%.4f"}
_QUIET_META = {"step_source", "value_format", "loss_scale_zero_means_small", "batches_per_epoch", "versions",
               "step_unit"}
_ERROR_KINDS = {"error", "hardware_error", "oom"}
_MAX_DAMAGED = 20
_TB = "Traceback (most recent call last)"
_BAR = re.compile(r"\d%\|")
_TRACEBACK = object()  # asm.line's answer for a line inside a traceback
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


_SCAN_BYTES = 64 << 20  # how far sniff looks for metric lines (after a script dump, a banner, a traceback)
_CAND = re.compile(kv.CANDIDATE)


def _metric_lines_later(path: Path) -> bool:
    """True when a general metric line with a step appears anywhere in the first 64 MiB (read in 1 MiB pieces)."""
    seen = 0
    tail = b""
    with open_binary(path) as fh:
        while seen < _SCAN_BYTES:
            chunk = fh.read(1 << 20)
            if not chunk:
                return False
            if b"\0" in chunk:
                return False
            seen += len(chunk)
            data = tail + chunk
            cut = data.rfind(b"\n")
            data, tail = (data, b"") if cut < 0 else (data[:cut], data[cut + 1:])
            for line in data.decode("utf-8", errors="replace").splitlines():
                if _CAND.search(line):
                    r = kv.parse_line(common.clean(line), {})
                    if r is not None and r.step is not None:
                        return True
    return False


def sniff(path: Path) -> bool:
    """True for text logs: ``*.log|out|err``, ``stdout*``, log-like ``*.txt``, or any text with a metric line.

    The metric line may come after 64 KiB of other text (a script that prints its own source first):
    the first 64 MiB are searched. Never raises.
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
            return any(k in name for k in _LOG_NAMES) or _recognised(text) or _metric_lines_later(path)
        return suffix == "" and (_recognised(text) or _metric_lines_later(path))
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
        self.last: dict[tuple[int | None, str, str], int] = {}  # (rank, framework, line keys) -> step
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
        self.skip_counts: Counter[str] = Counter()
        self.rank: int | None = None
        self.hint: tuple[bool, bool] | None = None  # (may be a general metric line, may be an event line)
        self.ranks: Counter[int] = Counter()
        self.rank_seen: set[tuple[int, int, str]] = set()

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
        if r.metrics:
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
        for m in metrics:
            key = (self.segment, step, m[0])
            if key not in self.rank_seen:
                self.rank_seen.add(key)
                out.append(m)
        if len(out) < len(metrics):
            self.skip_counts["values another rank already logged"] += len(metrics) - len(out)
        return out

    def went_back(self, step: int, counter: tuple[str, str]) -> bool:
        """True when a counter's step goes back (a restart).

        A counter is one rank's step as one kind of line prints it: a framework module's lines, or the
        general reader's lines with one set of keys (``counter``, :func:`_counter`). A step below another
        kind of line's step (DeepSpeed's ``step=10`` among PPO's ``step: 9``) is not a restart.
        """
        last = self.last.get((self.rank, *counter))
        return last is not None and step < last

    def set_last(self, step: int, counter: tuple[str, str]) -> None:
        self.last[(self.rank, *counter)] = step

    def metrics(self, r: LineRecord) -> None:
        step = r.step if r.step is not None else self.any_step
        if step is None:
            self.skip_counts["metric line before any step"] += 1
            return
        counter = _counter(r.framework, r.metrics)
        if r.step is not None and self.went_back(r.step, counter):
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
            self.set_last(step, counter)
        self.any_step = step
        self.activity = True
        self.launch_open = False
        self.block_kinds.clear()
        self.last_ckpt = None

    def bulk(self, lines: list[tuple[int | None, list, float | None, int | None]]) -> None:
        """Metric lines read by the general reader (:mod:`parsers.lines.kv`) in bulk, in file order.

        Each item is ``(step or None, [(metric, tag, value)], wall_time, rank)``; the rules are those of
        :meth:`metrics` for a general line (a step that goes back opens a segment; a line without a step
        belongs to the last step seen; another rank's lines are counted, not kept).
        """
        rows = self.rows
        for step, mets, wall, rank in lines:
            self.rank = rank
            explicit = step is not None
            if step is None:
                step = self.any_step
                if step is None:
                    self.skip_counts["metric line before any step"] += 1
                    continue
            counter = _counter("generic", mets)
            if explicit and self.went_back(step, counter):
                self.brk()
            mets = self.rank_rows(step, dedupe_canonical(mets))
            if not mets:
                continue
            for name, tag, v in mets:
                if v is not None and not math.isfinite(v) and kv.is_objective(name):
                    self.event("nan_detected", kv.nonfinite_message(tag, v), step)
            rows.extend(self.segment, step, mets, wall)
            self.frameworks["generic"] += len(mets)
            self.seg_rows += len(mets)
            if explicit:
                self.set_last(step, counter)
            self.any_step = step
        if lines:
            self.activity = True
            self.launch_open = False
            self.block_kinds.clear()
            self.last_ckpt = None

    def bulk_frame(self, lines: pl.DataFrame, mets: pl.DataFrame, walls: np.ndarray, lo: int) -> bool:
        """A long run of general metric lines without rank prefixes, as arrays (the rules of :meth:`bulk`).

        Args:
            lines: ``line``, ``step`` (null: the last step seen) per metric line, in line order.
            mets: ``line``, ``metric``, ``tag``, ``value`` per metric, in line order.
            walls: Wall time (NaN: none) of every line of the run; ``walls[0]`` is line ``lo``.
            lo: The run's first line.

        Returns:
            False (nothing done) when a line names one metric twice: :meth:`bulk` then handles the run.
        """
        if lines.height == 0:
            return True
        if lines.get_column("dup").any():
            return False
        line_no = lines.get_column("line").to_numpy().astype(np.int64)
        st = lines.get_column("step")
        explicit = st.is_not_null().to_numpy()
        steps = st.fill_null(-1).to_numpy().astype(np.int64)
        sig = lines.get_column("sig")
        brk, last = self._breaks(steps, explicit, sig)
        # a line without a step belongs to the last step seen
        idx = np.where(explicit, np.arange(steps.shape[0]), -1)
        np.maximum.accumulate(idx, out=idx)
        filled = np.where(idx >= 0, steps[np.maximum(idx, 0)], -1)
        have = idx >= 0
        if self.any_step is not None:
            filled[~have] = self.any_step
            have[:] = True
        if not self.seg_rows and brk[0]:
            brk[0] = False
        n_skip = int((~have).sum())
        if n_skip:
            self.skip_counts["metric line before any step"] += n_skip
            brk &= have
        seg = (np.cumsum(brk) + self.segment).astype(np.int32)
        # per metric row: the row of its line
        ml = mets.get_column("line").to_numpy().astype(np.int64)
        row = np.searchsorted(line_no, ml)
        keep = have[row]
        row = row[keep]
        n = int(row.shape[0])
        vals = mets.get_column("value").to_numpy()[keep]
        wt = walls[ml[keep] - lo]
        src = self.rows.source
        names = mets.get_column("metric").to_arrow().filter(pa.array(keep))
        tags = mets.get_column("tag").to_arrow().filter(pa.array(keep))
        table = pa.Table.from_arrays([
            repeat_string("", n), pa.array(seg[row], pa.int32()), pa.array(filled[row], pa.int64()),
            names.cast(pa.string()), pa.array(vals, pa.float64()),
            pa.array(wt, pa.float64(), mask=np.isnan(wt)), tags.cast(pa.string()),
            repeat_string(src, n)], schema=METRICS_SCHEMA)
        self.rows.add_chunk(table)
        bad = np.flatnonzero(~np.isfinite(vals))
        if bad.size:
            names_l, tags_l = names.to_pylist(), tags.to_pylist()
            segs, stps = seg[row], filled[row]
            for k in bad.tolist():
                if kv.is_objective(names_l[k]):
                    self.segment, seg_now = int(segs[k]), self.segment
                    self.event("nan_detected", kv.nonfinite_message(tags_l[k], float(vals[k])), int(stps[k]))
                    self.segment = seg_now
        n_brk = int(brk.sum())
        self.segment += n_brk
        if n_brk:
            self.seg_rows = int((seg[row] == self.segment).sum())
        else:
            self.seg_rows += n
        if n_brk:
            self.last = {}
        self.last.update(last)
        if have.any():
            self.any_step = int(filled[have][-1])
        self.frameworks["generic"] += n
        self.activity = True
        self.launch_open = False
        self.block_kinds.clear()
        self.last_ckpt = None
        return True

    def _breaks(self, steps: np.ndarray, explicit: np.ndarray, sig: pl.Series) -> tuple[np.ndarray, dict]:
        """Where a run of general metric lines opens a segment: a counter's step goes back (:meth:`went_back`).

        Args:
            steps: Step per line (any value where not ``explicit``).
            explicit: The line gives its step.
            sig: The line's keys (its counter, :func:`_counter`).

        Returns:
            ``(breaks, last)``: a bool per line, and each counter's last step after the last break.
        """
        n = steps.shape[0]
        brk = np.zeros(n, dtype=bool)
        pos = np.flatnonzero(explicit)
        if not pos.size:
            return brk, {}
        names = sig.gather(pl.Series(pos, dtype=pl.UInt32))
        uniq = names.unique(maintain_order=True)
        keys = [(None, "generic", u) for u in uniq.to_list()]
        g = names.replace_strict(uniq, pl.Series(range(len(keys)), dtype=pl.Int64)).to_numpy()
        s = steps[pos]
        order = np.argsort(g, kind="stable")
        gs, ss, ps = g[order], s[order], pos[order]
        first = np.ones(gs.shape[0], dtype=bool)
        first[1:] = gs[1:] != gs[:-1]
        prev = np.empty_like(ss)
        prev[1:] = ss[:-1]
        prev_pos = np.full(ss.shape[0], -1, dtype=np.int64)
        prev_pos[1:] = ps[:-1]
        before = np.array([self.last.get(keys[k], np.iinfo(np.int64).min) for k in gs[first]], dtype=np.int64)
        prev[first] = before
        prev_pos[first] = -1
        cand = np.flatnonzero(ss < prev)
        last_brk = -1
        for c in sorted(cand.tolist(), key=lambda c: ps[c]):  # a break resets every counter: few, in order
            if prev_pos[c] >= last_brk:
                brk[ps[c]] = True
                last_brk = int(ps[c])
        after = ps >= last_brk
        last: dict = {}
        for k, v in zip(gs[after].tolist(), ss[after].tolist(), strict=True):
            last[keys[k]] = v
        return brk, last

    # -- one line --------------------------------------------------------------------------------
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
        for k, v in kv.meta_of(self.state).items():
            self.meta.setdefault(k, v)
        if self.ranks:
            self.meta["ranks"] = {"metric_lines_per_rank": dict(sorted(self.ranks.items())),
                                  "why": "interleaved rank-prefixed lines are one run: a value several ranks print "
                                         "is kept once, a rank's step never reads as a restart of another's"}
        out_of_range = self.rows.out_of_range_steps() + self.state.get("kv_step_out_of_range", 0)
        if out_of_range:
            self.skip_counts["step outside int64 (not a step)"] += out_of_range
        if self.skip_counts:
            self.meta["skipped_lines"] = dict(self.skip_counts)
        return keep, self.meta


def _counter(framework: str, metrics: list) -> tuple[str, str]:
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


_BLOCK = 1 << 16  # lines per block: memory stays bounded, polars' kernels stay busy
_RANK_BRACKET = r"^\[(?:rank|default|Rank)\s*(\d+)\]:\s?"
_RANK_NUM = r"^(\d{1,5}):\s"
_RANK_ANY = r"^(?:\[(?:rank|default|Rank)|[0-9]{1,5}:\s)"
_ANSI = (r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_DIGITS = kv_bulk.SHAPE
_US = r"[0-9]{2}/[0-9]{2}/[0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}"
_ISO = r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?"


def _clean_block(pieces: list[str]) -> tuple[pl.Series, list[int | None]]:
    """:func:`parsers.lines.common.clean` over many lines at once, with each line's rank prefix.

    Returns:
        The cleaned lines and, per line, the rank of a ``[rankN]:``/``[defaultN]:``/``N: `` prefix (or None).
    """
    t = pl.Series("t", pieces, dtype=pl.Utf8)
    if t.str.contains("\x1b", literal=True).any():
        t = t.str.replace_all(_ANSI, "")
    t = t.str.strip_chars_end()
    ranks: list[int | None] = [None] * t.len()
    has = t.str.contains(_RANK_ANY).arg_true()
    if has.len() == 0:
        return t, ranks
    sub = t.gather(has)
    df = pl.DataFrame({"t": sub}).select(
        "t",
        pl.col("t").str.extract(_RANK_BRACKET, 1).cast(pl.Int64, strict=False).alias("r1"),
        pl.col("t").str.extract(_RANK_NUM, 1).cast(pl.Int64, strict=False).alias("r2"),
        pl.col("t").str.replace(_RANK_BRACKET, "").alias("c1"),
        pl.col("t").str.replace(_RANK_NUM, "").alias("c2"),
    ).select(
        pl.when(pl.col("r1").is_not_null()).then(pl.col("c1"))
        .when(pl.col("r2").is_not_null() & (pl.col("c2").str.strip_chars() != "")).then(pl.col("c2"))
        .otherwise(pl.col("t")).alias("line"),
        pl.when(pl.col("r1").is_not_null()).then(pl.col("r1"))
        .when(pl.col("r2").is_not_null() & (pl.col("c2").str.strip_chars() != "")).then(pl.col("r2"))
        .alias("rank"),
    )
    t = t.scatter(has, df.get_column("line"))
    for i, r in zip(has.to_list(), df.get_column("rank").to_list(), strict=True):
        ranks[i] = r
    return t, ranks


def _wall_times(lines: pl.Series) -> list[float | None]:
    """:func:`parsers.lines.common.wall_time` over many lines (ISO timestamps vectorised; others per line)."""
    head = lines.str.slice(0, 64)
    walls: list[float | None] = [None] * head.len()
    iso = head.str.contains(_ISO).arg_true()
    if iso.len():
        g = pl.DataFrame({"h": head.gather(iso)}).select(pl.col("h").str.extract_groups(_ISO).alias("g")).unnest("g")
        g.columns = ["y", "mo", "d", "hh", "mi", "ss", "frac"]
        stamp = pl.concat_str([pl.col("y"), pl.lit("-"), pl.col("mo"), pl.lit("-"), pl.col("d"), pl.lit(" "),
                               pl.col("hh"), pl.lit(":"), pl.col("mi"), pl.lit(":"), pl.col("ss")])
        w = g.select(
            (stamp.str.strptime(pl.Datetime("us", "UTC"), "%Y-%m-%d %H:%M:%S", strict=False).dt.epoch("s")
             .cast(pl.Float64) + pl.concat_str([pl.lit("0."), pl.col("frac")]).cast(pl.Float64, strict=False)
             .fill_null(0.0)).alias("w")).get_column("w").to_list()
        for i, v in zip(iso.to_list(), w, strict=True):
            walls[i] = v
    for i in head.str.contains(_US).arg_true().to_list():
        if walls[i] is None:
            walls[i] = common.wall_time(head[i])
    return walls


_EVENT = re.compile(common.EVENT_ANY)


class _Eventish:
    """Per line of a block: may it be an event line (:data:`parsers.lines.common.EVENT_ANY`)?

    Scanned in one column operation for the lines that are not metric candidates; a candidate line
    (most of them are read in bulk and never asked) is scanned when asked.
    """

    def __init__(self, lines: pl.Series, cand: pl.Series) -> None:
        self.lines = lines
        self.cand = cand.to_numpy()
        rest = (~cand).arg_true()
        self.known = np.zeros(lines.len(), dtype=bool)
        if rest.len():
            self.known[rest.to_numpy()] = lines.gather(rest).str.strip_chars().str.contains(common.EVENT_ANY).to_numpy()

    def __getitem__(self, i: int) -> bool:
        if self.cand[i]:
            return bool(_EVENT.search(self.lines[i].strip()))
        return bool(self.known[i])


class _Reader:
    """Feeds blocks of lines to the assembler: the general reader's lines in bulk, the rest one by one.

    A line that may be a metric line (:data:`parsers.lines.kv.CANDIDATE`) is reduced to its *shape* (digits
    replaced). The first line of each shape goes through the framework modules and the general reader
    one by one; when the general reader took it, every later line of that shape is read in bulk by
    :func:`parsers.lines.kv.parse_block` (a framework module's trap is never bypassed: its shapes are
    never bulk-read). A long run of such lines becomes rows without a Python loop over them
    (:meth:`_Assembler.bulk_frame`); a short run, or one with rank prefixes, goes through
    :meth:`_Assembler.bulk`.
    """

    LONG_RUN = 48
    SMALL = 2000

    def __init__(self, asm: _Assembler) -> None:
        self.asm = asm
        self.owned: dict[str, bool] = {}
        self.inert: dict[str, str] = {}
        self.plans: dict[str, kv_bulk.Plan | None] = {}

    def block(self, pieces: list[str], lineno: int) -> int:
        """Read one block of raw pieces (lines with their ends) starting at line number ``lineno``."""
        if not pieces:
            return lineno
        linenos = []
        for p in pieces:
            linenos.append(lineno)
            lineno += p.endswith("\n")
        if len(pieces) < self.SMALL:  # a short file: per line is faster than setting up the column kernels
            return self.small(pieces, linenos, lineno)
        lines, ranks = _clean_block(pieces)
        n = lines.len()
        code = lines.str.contains(kv.CODE)
        cand_mask = lines.str.contains(kv.CANDIDATE) & ~code
        eventish = _Eventish(lines, cand_mask)
        cand_idx = cand_mask.arg_true()
        asm, owned = self.asm, self.owned
        text = lines.to_list()
        skip_code = (code & ~cand_mask).to_numpy()
        all_shapes = lines.str.replace_all(_DIGITS, "#")
        self._other = (text, linenos, ranks, eventish, skip_code, all_shapes.to_list())
        if cand_idx.len() == 0:
            for i in range(n):
                self.other(i)
            asm.hint = None
            return lineno
        cl = lines.gather(cand_idx)
        shape_s = all_shapes.gather(cand_idx)
        uniq = shape_s.unique(maintain_order=True)
        codes = shape_s.replace_strict(uniq, pl.Series(range(uniq.len()), dtype=pl.Int64)).to_numpy()
        uniq_list = uniq.to_list()
        own = np.array([(1 if owned[u] else 0) if u in owned else -1 for u in uniq_list], dtype=np.int8)
        cand_np = cand_idx.to_numpy().astype(np.int64)
        pos_arr = np.full(n, -1, dtype=np.int64)
        pos_arr[cand_np] = np.arange(cand_np.shape[0])
        first_pos = np.unique(codes, return_index=True)[1]
        first_pos = first_pos[own[codes[first_pos]] == -1]
        per_line = np.ones(n, dtype=bool)
        per_line[cand_np] = False
        per_line[cand_np[first_pos]] = True
        per_idx = np.flatnonzero(per_line).tolist()
        line_df, met_df = kv_bulk.read_block(cl, shape_s, asm.state, self.plans)
        gl = pl.Series(cand_np, dtype=pl.UInt32)  # positions in ``cl`` -> indices in the block
        line_df = line_df.with_columns(pl.col("line").map_batches(lambda c: gl.gather(c), return_dtype=pl.UInt32))
        met_df = met_df.with_columns(pl.col("line").map_batches(lambda c: gl.gather(c), return_dtype=pl.UInt32))
        walls = np.full(n, np.nan)
        wl = np.array(_wall_times(cl), dtype=np.float64)
        walls[cand_np] = wl
        self._ctx = (text, linenos, ranks, walls, line_df, met_df)
        self._eventish = eventish
        self._steps: dict[int, int | None] | None = None
        pos = 0
        for j in [*per_idx, n]:
            if j > pos:
                ok = own[codes[pos_arr[pos:j]]] == 1
                self.gap(pos, j, ok)
            if j < n:
                k = pos_arr[j]
                if k < 0:
                    self.other(j)
                    pos = j + 1
                    continue
                asm.rank = ranks[j]
                asm.hint = (True, eventish[j])
                mod = asm.line(text[j], linenos[j])
                if k >= 0 and own[codes[k]] == -1:
                    own[codes[k]] = 1 if mod is kv else 0
                    owned[uniq_list[codes[k]]] = mod is kv
            pos = j + 1
        asm.hint = None
        return lineno

    def small(self, pieces: list[str], linenos: list[int], lineno: int) -> int:
        """A block too short for the column kernels: every line one by one (the same rules, the same rows)."""
        asm = self.asm
        asm.hint = None
        for piece, ln in zip(pieces, linenos, strict=True):
            line, asm.rank = common.clean_rank(piece)
            if asm.tb is None and asm.dump is None and kv.is_code(line) and not kv.is_candidate(line):
                asm.skip_counts["script source"] += 1
                continue
            asm.line(line, ln)
        return lineno

    def other(self, i: int) -> None:
        """A line that is not a metric candidate: script source is counted; a repeated inert shape skipped.

        A shape is *inert* when its first line, read one by one with no dump or traceback open, changed
        nothing (no record, event or open dump: no module and no rule took it) and the block's event scan
        says no event; later lines of that shape are then counted under the same reason, not re-read.
        """
        asm = self.asm
        text, linenos, ranks, eventish, skip_code, shapes = self._other
        idle = asm.tb is None and asm.dump is None
        if skip_code[i] and idle:
            asm.skip_counts["script source"] += 1
            return
        sh = shapes[i]
        if idle and not eventish[i]:
            why = self.inert.get(sh)
            if why is not None:
                asm.skip_counts[why] += 1
                return
        asm.rank = ranks[i]
        asm.hint = (False, eventish[i])
        before = (len(asm.rows), len(asm.rows.events), len(asm.meta), len(asm.configs), len(asm.state),
                  sum(asm.skip_counts.values()))
        counts = dict(asm.skip_counts)
        mod = asm.line(text[i], linenos[i])
        after = (len(asm.rows), len(asm.rows.events), len(asm.meta), len(asm.configs), len(asm.state))
        if (mod is None and idle and not eventish[i] and asm.tb is None and asm.dump is None
                and after == before[:5]):
            grew = [k for k, v in asm.skip_counts.items() if v != counts.get(k, 0)]
            why = grew[0] if grew else "no metric, event or configuration"
            if not grew:
                asm.skip_counts[why] += 1
            self.inert[sh] = why

    def _items(self, lo: int, hi: int) -> list:
        """The metric lines ``lo..hi-1`` as :meth:`_Assembler.bulk` items."""
        text, linenos, ranks, walls, line_df, met_df = self._ctx
        if self._steps is None:
            self._steps = dict(zip(line_df.get_column("line").to_list(), line_df.get_column("step").to_list(),
                                   strict=True))
            self._cols = (met_df.get_column("line").to_numpy(), met_df.get_column("metric").to_list(),
                          met_df.get_column("tag").to_list(), met_df.get_column("value").to_list())
        steps = self._steps
        ml, mm, mt, mv = self._cols
        a, b = np.searchsorted(ml, [lo, hi])
        out = []
        k = int(a)
        for x in range(lo, hi):
            if x not in steps:
                continue
            k0 = k
            while k < b and ml[k] == x:
                k += 1
            w = walls[x]
            out.append((steps[x], list(zip(mm[k0:k], mt[k0:k], mv[k0:k], strict=True)),
                        None if w != w else float(w), ranks[x]))
        return out

    def gap(self, a: int, b: int, ok: np.ndarray) -> None:
        """Lines ``a..b-1``: candidates whose shape was seen before; bulk where the general reader owns it."""
        asm = self.asm
        text, linenos, ranks, walls, line_df, met_df = self._ctx
        # runs of equal ``ok``
        edges = np.flatnonzero(np.diff(ok.astype(np.int8))) + 1
        starts = [0, *edges.tolist()]
        ends = [*edges.tolist(), len(ok)]
        for s0, e0 in zip(starts, ends, strict=True):
            lo, hi = a + s0, a + e0
            if not ok[s0] or asm.tb is not None:
                for i in range(lo, hi):
                    asm.rank = ranks[i]
                    asm.hint = (True, self._eventish[i])
                    asm.line(text[i], linenos[i])
                continue
            if asm.dump is not None:
                asm.end_dump(linenos[lo])
            if hi - lo >= self.LONG_RUN and all(r is None for r in ranks[lo:hi]):
                ld = line_df.filter((pl.col("line") >= lo) & (pl.col("line") < hi))
                md = met_df.filter((pl.col("line") >= lo) & (pl.col("line") < hi))
                if asm.bulk_frame(ld, md, walls[lo:hi], lo):
                    continue
            asm.bulk(self._items(lo, hi))


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
    reader = _Reader(asm)
    lineno = 1
    buf: list[str] = []
    try:
        with open_text(path) as fh:  # splits on \n, \r\n, \r; .gz read transparently
            for piece in fh:
                buf.append(piece)
                if len(buf) > _BLOCK:
                    last = buf.pop()  # the newest piece waits: it may be the unterminated last line
                    lineno = reader.block(buf, lineno)
                    buf = [last]
    except (OSError, EOFError) as exc:
        if lineno == 1 and not buf:
            raise ParseError(rel, f"unreadable: {exc.strerror or exc}") from None
        why = f"unreadable from here on ({exc.strerror or exc}); earlier lines kept"
        skipped.append(Skip(f"{rel}:{lineno + sum(p.endswith(chr(10)) for p in buf[:-1])}", why))
    if buf and not buf[-1].endswith(("\n", "\r")):
        last = buf.pop()
        lineno = reader.block(buf, lineno)
        if last.strip():
            skipped.append(Skip(f"{rel}:{lineno}", "unterminated last line (the writer was killed mid-line); "
                                                   "not parsed"))
    else:
        lineno = reader.block(buf, lineno)
    lines = lineno - 1
    keep, meta = asm.finish(lines)
    skipped[:0] = asm.skipped
    precision = meta.get("value_format") or _PRECISION.get(meta["framework"], "text")
    table = _terms_of_a_loss_log(asm.rows.metrics_table(keep), path, meta)
    return ParseResult(format=FORMAT, path=rel, metrics=table,
                       events=asm.rows.events_table(), meta=meta, skipped=tuple(skipped), precision=precision)


_NOT_TERMS = frozenset({"epoch", "iters", "iter", "time", "data", "eta", "lr", "memory", "mem", "it", "step",
                        "step_time", "throughput", "tokens", "samples", "batch_size", "grad_norm", "loss_scale"})


def _terms_of_a_loss_log(table: Any, path: Path, meta: dict[str, Any]) -> Any:
    """Short keys named by their file: the unnamed terms of a file named for its losses are loss components.

    CycleGAN's ``loss_log.txt`` prints ``D_A: x G_A: x cycle_A: x ...``: they become ``loss/<term>``, each with
    why in ``meta["names_from_context"]``.
    """
    if "loss" not in path.name.lower() or table.num_rows == 0:
        return table
    df = pl.from_arrow(table)
    names = df.get_column("metric").unique().to_list()
    if any(n.split("/")[0] in ("loss", "eval_loss", "ppl", "eval_ppl") for n in names):
        return table
    terms = [n for n in names if n == canonical_metric(n) and n.lower() not in _NOT_TERMS]
    if not terms:
        return table
    meta["names_from_context"] = {t: f"loss/{t}: a term of {path.name} (the file is named for its losses)"
                                  for t in sorted(terms)}
    df = df.with_columns(pl.when(pl.col("metric").is_in(terms)).then(pl.lit("loss/") + pl.col("metric"))
                         .otherwise(pl.col("metric")).alias("metric"))
    return df.to_arrow().cast(METRICS_SCHEMA)
