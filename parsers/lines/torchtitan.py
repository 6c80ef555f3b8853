r"""torchtitan stdout, docs/formats.md#torchtitan.

Why a module: lines cut by interleaved writes start like a metric line but must not be read in part
(listed as damaged), and ``Training starts at step N`` says a resume without a checkpoint line. A line is taken
as a damaged torchtitan line only in a file that has shown torchtitan lines (its prefix or a whole metric line):
elsewhere ``step: 40  loss: 2.96  time: 0.31`` is a script's own line, read by the general reader.

The logger is the root logger with the format ``[titan] %(asctime)s - %(name)s - %(levelname)s -
%(message)s`` (``pytorch/torchtitan:torchtitan/tools/logging.py``); torchrun may put ``[rank0]:`` in
front (removed by :func:`parsers.lines.common.clean`, as are the ANSI colours: ``Color`` in
``torchtitan/tools/utils.py`` uses ``\033[31m``.. and 24-bit ``\033[38;2;180;60;0m``, reset
``\033[39m``). The training line, by version (``MetricsProcessor.log`` in
``torchtitan/components/metrics.py``, formerly ``train.py``; a line that starts like one of these but
does not parse, cut by an interleaved write, is listed as damaged, never read in part)::

    # 2024 (train.py, until PR #697)
    f"{color.cyan}step: {step:2}  {color.green}loss: {loss:7.4f}  {color.yellow}memory: {gib:5.2f}GiB"
    f"({pct:.2f}%)  {color.blue}wps: {round(wps):,}  {color.magenta}mfu: {mfu:.2f}%{color.reset}"
    # 2024-11 .. 2025-06: ``tps`` instead of ``wps``, then ``tflops: {tflops:,.2f}`` before ``mfu``
    # 2025-06 (PR #1339, "Log grad_norm"): ``{color.orange}grad_norm: {grad_norm:7.4f}`` after the loss
    # 2026-02 (PR #2315): ``loss: {global_avg_loss:8.5f}``; ``mfu: N/A`` when quantized training has no MFU
    f"{color.red}step: {step:2}  {color.green}loss: {global_avg_loss:8.5f}  "
    f"{color.orange}grad_norm: {grad_norm:7.4f}  {color.turquoise}memory: {gib:5.2f}GiB({pct:.2f}%)  "
    f"{color.blue}tps: {round(tps):,}  {color.cyan}tflops: {tflops:,.2f}  {color.magenta}mfu: {mfu_str}{color.reset}"

and the validation line (``MetricsProcessor.log_validation``): ``validate step: {step:2}  loss: {loss:7.4f}
memory: {gib:5.2f}GiB({pct:.2f}%)  tps: {round(tps):,}``. A NaN loss prints as ``loss:      nan``.

Rows: ``loss``, ``grad_norm``, ``memory_reserved_gib``, ``memory_reserved_pct``, ``throughput`` (tps or
wps: tokens per second per device), ``tflops``, ``mfu`` (percent; no row for ``N/A``); validation rows
are ``eval_loss``, ``eval_memory_reserved_gib``, ``eval_memory_reserved_pct``, ``eval_throughput``.
Checkpoint lines (``torchtitan/components/checkpoint.py``, ``checkpointer/dcp.py``): ``Saving the
checkpoint (or staging if async is enabled).``, ``Saving a full checkpoint at last step, step N.``,
``Loading the checkpoint at step N.`` (until 2025-06), ``Loading the checkpoint from <folder>/step-N.``;
``Training starts at step N`` (N > 1: the run resumed from step N - 1), ``Training completed``; a launch
starts with ``Starting job: <description>`` (until 2026-02) or ``torchtitan version: <v> (...)``.
"""

from __future__ import annotations

import math
import re

from parsers.lines import LineRecord, metric
from parsers.lines.common import wall_time

_PREFIX = re.compile(r"^\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?) - [\w.]+ - [A-Z]+ - ")
_F = r"[-+]?(?:\d[\d,]*(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)"
_TRAIN = re.compile(
    rf"^step:\s*(\d+)\s+loss:\s*({_F})\s+(?:grad_norm:\s*({_F})\s+)?memory:\s*({_F})GiB\(({_F})%\)\s+"
    rf"(tps|wps):\s*({_F})(?:\s+tflops:\s*({_F}))?\s+mfu:\s*(?:({_F})%|N/A)\s*$"
)
_VALID = re.compile(
    rf"^validate step:\s*(\d+)\s+loss:\s*({_F})\s+memory:\s*({_F})GiB\(({_F})%\)\s+tps:\s*({_F})\s*$"
)
_LOAD = re.compile(r"^Loading the checkpoint (?:at step (\d+)|from (\S*?))\.?$")
_LAST_SAVE = re.compile(r"^Saving a (?:full|model only) checkpoint .*at last step, step (\d+)\.$")
_STARTS = re.compile(r"^Training starts at step (\d+)\.?$")
_SHAPE = re.compile(r"(?:validate )?step:\s+\d+  ")  # torchtitan's f"step: {step:2}  loss: ..." (two spaces)
_STEP_DIR = re.compile(r"step-(\d+)/?$")


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _rows(pairs: list[tuple[str, str, str | None]]) -> list:
    out = []
    for tag, name, raw in pairs:
        v = _num(raw)
        if v is not None:
            out.append(metric(tag, v, name))
    return out


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one torchtitan line.

    Args:
        line: A cleaned line (ANSI colours and ``[rankN]:`` removed).
        state: Per-file state: ``torchtitan`` is set once a line was torchtitan's (its prefix or a whole
            metric line); before that, a ``step: N  loss: X`` line without the prefix that is not a whole
            torchtitan line is a script's own line (the general reader's), not a damaged torchtitan line.

    Returns:
        A record, or ``None`` when the line is not a torchtitan shape.
    """
    m = _PREFIX.match(line)
    if m is None:
        if not _SHAPE.match(line):
            return None
        msg, ts = line, None
    else:
        msg, ts = line[m.end():].strip(), wall_time(m.group(1))
        state["torchtitan"] = True
    t = _TRAIN.match(msg)
    if t:
        state["torchtitan"] = True
        step, loss, gn, gib, pct, unit, tput, tflops, mfu = t.groups()
        out = _rows([("loss", "loss", loss), ("grad_norm", "grad_norm", gn),
                     ("memory", "memory_reserved_gib", gib), ("memory %", "memory_reserved_pct", pct),
                     (unit, "throughput", tput), ("tflops", "tflops", tflops), ("mfu", "mfu", mfu)])
        events = []
        bad = [n for n, _, v in out if n in ("loss", "grad_norm") and v is not None and not math.isfinite(v)]
        if bad:
            events.append(("nan_detected", f"step {step}: non-finite {' and '.join(bad)}: {msg[:200]}", int(step)))
        return LineRecord("torchtitan", step=int(step), metrics=out, events=events, wall_time=ts)
    v = _VALID.match(msg)
    if v:
        state["torchtitan"] = True
        step, loss, gib, pct, tput = v.groups()
        out = _rows([("validate loss", "eval_loss", loss), ("validate memory", "eval_memory_reserved_gib", gib),
                     ("validate memory %", "eval_memory_reserved_pct", pct), ("validate tps", "eval_throughput", tput)])
        return LineRecord("torchtitan", step=int(step), metrics=out, eval=True, wall_time=ts)
    if _SHAPE.match(msg):
        if not state.get("torchtitan"):
            return None
        return LineRecord("torchtitan", damaged=f"torchtitan metric line that does not parse (cut or garbled): "
                                                f"{msg[:120]!r}")
    if m is None:
        return None
    return _run_line(msg)


def _run_line(msg: str) -> LineRecord | None:
    """Checkpoint loads and saves, the first step of a resumed launch, the launch and job-end lines."""
    ld = _LOAD.match(msg)
    if ld:
        step_text = ld.group(1) or (_STEP_DIR.search(ld.group(2) or "") or [None, None])[1]
        step = int(step_text) if step_text is not None else None
        return LineRecord("torchtitan", step=step, resume=True, events=[("checkpoint_loaded", msg, step)])
    ls = _LAST_SAVE.match(msg)
    if ls:
        return LineRecord("torchtitan", events=[("checkpoint_saved", msg, int(ls.group(1)))])
    if msg.startswith(("Saving the checkpoint", "Staging the checkpoint")):
        return LineRecord("torchtitan", events=[("checkpoint_saved", msg, None)])
    st = _STARTS.match(msg)
    if st:
        first = int(st.group(1))
        if first > 1:
            return LineRecord("torchtitan", step=first - 1, resume=True,
                              events=[("checkpoint_loaded", msg, first - 1)])
        return LineRecord("torchtitan")
    if msg.startswith(("Starting job:", "torchtitan version:")):  # the first line of a launch (until/since 2026-02)
        return LineRecord("torchtitan", launch=True)
    if msg == "Training completed":
        return LineRecord("torchtitan", events=[("job_end", msg, None)])
    return None
