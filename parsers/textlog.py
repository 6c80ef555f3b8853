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

import re
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.compute as pc

from forensics.errors import ParseError
from forensics.model import ParseResult, Skip
from forensics.schema import METRICS_SCHEMA, canonical_metric
from parsers import file_policy
from parsers._io import logical_name, logical_suffix, open_binary, open_text, stream_error
from parsers._text_damage import drop_nuls, head_text
from parsers._textlog_asm import MODULES as _MODULES
from parsers._textlog_asm import Assembler as _Assembler
from parsers._textlog_block import BLOCK as _BLOCK
from parsers._textlog_block import Reader as _Reader
from parsers._textlog_prep import Pipeline, Prepared
from parsers.lines import common, kv
from parsers.rank_files import values_table

__all__ = ["FORMAT", "read", "sniff"]
_READ_HINT = 1 << 20  # characters per read: whole lines, memory bounded by the block

FORMAT = "textlog"
HEAD_BYTES = 64 * 1024
_LOG_NAMES = ("log", "stdout", "stderr", "output")
_PRECISION = {"megatron": "%.6E", "fairseq": "%.3f", "metaseq": "%.3f", "hf_trainer_stdout": "float64",
              "imagenet": "%.4f", "torchtitan": "%.4f", "nemo": "%.4g",
              "nanogpt": "%.4f"}


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
                chunk = head_text(chunk) or b""  # a crashed writer's NUL block, UTF-16 text; binary: nothing
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
        head = head_text(head)  # NUL blocks of a crashed writer removed, UTF-16 re-encoded; None: binary
        if head is None:
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
    rel = file_policy.rel(path, root)
    asm, skipped, lineno = _one_pass(path, rel, index_steps=False)
    if not len(asm.rows) and asm.skip_counts.get("metric line before any step"):
        asm, skipped, lineno = _one_pass(path, rel, index_steps=True)  # no step anywhere: a running index
    lines = lineno - 1
    keep, meta = asm.finish(lines)
    skipped[:0] = asm.skipped
    precision = meta.get("value_format") or _PRECISION.get(meta["framework"], "text")
    table = _episodes(_terms_of_a_loss_log(asm.rows.metrics_table(keep), path, meta), meta)
    return ParseResult(format=FORMAT, path=rel, metrics=table, events=asm.rows.events_table(), meta=meta,
                       skipped=tuple(skipped), precision=precision, ranks=values_table(asm.rank_values))


def _one_pass(path: Path, rel: str, index_steps: bool) -> tuple[_Assembler, list[Skip], int]:
    """One pass over the file: ``(assembler, skipped, next line number)``.

    With ``index_steps`` (a file whose loss lines carry no step anywhere: ``batch loss: 0.41``), every line is
    read one by one and each step-less metric line gets the next number of a running index (1, 2, ...),
    named in ``meta["step_axis"]`` as row numbers.
    """
    skipped: list[Skip] = []
    asm = _Assembler(rel)
    reader = _Reader(asm)
    if index_steps:
        asm.index_steps = 0
    pipe = Pipeline(_one_by_one if index_steps else reader.prepare, reader.consume, 1)
    buf: list[str] = []
    try:
        _read_lines(path, rel, pipe, buf, skipped)
        last = buf.pop() if buf and not buf[-1].endswith(("\n", "\r")) else None
        pipe.submit(buf)  # the last block too: its column half overlaps the block before
        lineno = pipe.drain()
        if last is not None and last.strip():
            skipped.append(Skip(f"{rel}:{lineno}", "unterminated last line (the writer was killed mid-line); "
                                                   "not parsed"))
    finally:
        pipe.close()
    return asm, skipped, lineno


def _one_by_one(pieces: list[str]) -> Prepared:
    """A block prepared to be read line by line (the running index of step-less lines is the assembler's)."""
    return Prepared(pieces, small=True, n_ends=sum(p.endswith("\n") for p in pieces))


def _read_lines(path: Path, rel: str, pipe: Pipeline, buf: list[str], skipped: list[Skip]) -> None:
    """Queue every full block of ``path`` on ``pipe``; the rest stays in ``buf`` (a read error is listed).

    Raises:
        ParseError: the file cannot be read at all.
    """
    seen = 0  # pieces read so far (numbering the NUL lines)
    try:
        with open_text(path, keep_error=True) as fh:  # splits on \n, \r\n, \r; .gz read transparently
            while True:
                got = fh.readlines(_READ_HINT)  # whole lines, split in C
                if not got:
                    break
                if any("\0" in g for g in got):  # a crashed node's NUL blocks: listed, the lines around read
                    got = drop_nuls(got, seen + 1, rel, skipped)
                seen += len(got)
                buf += got
                while len(buf) > _BLOCK:
                    rest = buf[_BLOCK:]  # the newest piece waits: it may be the unterminated last line
                    pipe.submit(buf[:_BLOCK])
                    buf[:] = rest
            cut = stream_error(fh)  # a gzip stream cut short: every line before the cut was read
            if cut is not None:
                raise EOFError(cut)
    except (OSError, EOFError) as exc:
        lineno = pipe.drain()
        said = getattr(exc, "strerror", None) or exc  # an EOFError has no strerror
        if lineno == 1 and not buf:
            raise ParseError(rel, f"unreadable: {said}") from None
        why = f"unreadable from here on ({said}); earlier lines kept"
        skipped.append(Skip(f"{rel}:{lineno + sum(p.endswith(chr(10)) for p in buf[:-1])}", why))


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


def _episodes(table: Any, meta: dict[str, Any]) -> Any:
    """An RL script's ``Episode N`` (read as an outer counter, like an epoch) is named ``episode``, not epoch.

    When the lines are stepped by it (no other step), ``meta["step_axis"]`` says so.
    """
    if table.num_rows == 0:
        return table
    at_epoch = pc.equal(table.column("metric"), "epoch")
    if not pc.any(at_epoch).as_py():
        return table
    tags = pc.unique(pc.filter(table.column("tag"), at_epoch)).to_pylist()  # a few names: the rows stay in C
    if not any(str(t).strip().lower() == "episode" for t in tags):
        return table
    df = pl.from_arrow(table)
    ep = (pl.col("metric") == "epoch") & (pl.col("tag").cast(pl.Utf8).str.strip_chars().str.to_lowercase() == "episode")
    if not df.select(ep.any()).item():
        return table
    if meta.get("step_unit") == "epoch" and not df.filter((pl.col("metric") == "epoch") & ~ep).height:
        meta["step_unit"] = "episode"
        meta["step_axis"] = {"column": df.filter(ep).get_column("tag")[0], "kind": "episode"}
    df = df.with_columns(pl.when(ep).then(pl.lit("episode")).otherwise(pl.col("metric")).alias("metric"))
    return df.to_arrow().cast(METRICS_SCHEMA)
