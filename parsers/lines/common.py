"""Framework-neutral line handling: cleaning, timestamps, numbers, errors, checkpoints, resumes.

:func:`clean` removes ANSI escapes and launcher prefixes (``[rank3]:``, ``[default7]:``);
:func:`parse_line` recognises the lines every log may hold whatever wrote it: a checkpoint
loaded or saved, a resume, error and hardware lines, the end of a job, package versions.
"""

from __future__ import annotations

import calendar
import re

from parsers.lines import LineRecord
from parsers.lines.pyrepr import parse as parse_repr

ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_PREFIX = re.compile(r"^(?:\[(?:rank|default|Rank)\s*\d+\]:\s?|\d{1,5}:\s(?=\s*\S))")
NUM = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf|INF|infinity|Infinity)"
_TS_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
_TS_US = re.compile(r"\b(\d{2})/(\d{2})/(\d{4}) (\d{2}):(\d{2}):(\d{2})\b")

# NCCL prints every warning as "NCCL WARN", also the benign start-up ones (an InfiniBand device or a network
# plugin that cannot be opened, after which NCCL falls back to another transport): a WARN is a fault only
# when it names one (a timeout, an abort, an error or status code, a CUDA failure, a broken connection).
HARDWARE = re.compile(
    r"cudaErrorECC|uncorrectable ECC|ECC error|\bXid\b|fallen off the bus|NCCL (?:error|Error)|"
    r"NCCL WARN.{0,300}?(?:[Tt]ime(?:out|d out)|[Aa]bort|Cuda failure|status=\s*[1-9]|\b[Ee]rror\b|"
    r"[Cc]onnection (?:reset|closed|refused)|closing connection|from peer|[Uu]nhandled)|"
    r"nccl\w*Error|NCCL communicator was aborted|Watchdog caught collective operation timeout|"
    r"ProcessGroupNCCL.{0,200}(?:timeout|Timeout|aborted)|NVLink|device-side assert|CUDA driver error|"
    r"hardware failure|node failure|GPU is lost|unknown error.{0,200}CUDA",
)
OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|\bOOM\b")
EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault))(?::\s?(.*))?$")
_ERRORISH = re.compile(
    r"^(?:terminate called after|Segmentation fault|Fatal Python error|.*core dumped|"
    r"RuntimeError: |CUDA error:|ERROR:|\S+ ERROR |.*\bNaN or Inf found\b)",
)
_NAN_TEXT = re.compile(
    r"(?i)(?:non-finite|\bnan\b|\binf\b).{0,40}\bloss\b|\bloss\b.{0,40}(?:\bnan\b|non-finite|\binf\b)|"
    r"found (?:NaN|Inf) in|Unexpected result nan|detected (?:nan|inf)",
)
_STEP_NUM = re.compile(
    r"(?i)(?:\bstep[_-]|checkpoint[_-]|\bckpt[_-]|\biter[_-])(\d+)\b|"
    r"\b(?:global[ _]step|global_step|step|iteration|iter|update|updates|epoch)\s*[:=#]?\s*(\d+)\b|"
    r"@\s*(\d+)\s+updates|\bat\s+(?:step|iteration)\s+(\d+)",
)
_SAVE = re.compile(r"(?i)\b(?:sav(?:ed|ing|e)|wrote|writing)\b.{0,200}?\b(?:checkpoint|ckpt|adapter weights|"
                   r"model weights|final weights|weights)\b|\bcheckpoint (?:saved|written)\b")
_LOAD = re.compile(r"(?i)\b(?:resum(?:e|ed|ing)\b|restored from|loaded (?:model )?checkpoint|"
                   r"loading checkpoint|continuing training from)")
_JOB_END = re.compile(
    r"CANCELLED AT|DUE TO TIME LIMIT|\[exiting program|exiting program after|after training is done|"
    r"Training completed|training finished|END TIME:",
)
_VERSIONS = re.compile(r"\b([A-Za-z][\w-]*)==(\d[\w.+-]*)")
_VERSIONS_LINE = re.compile(r"^(?:[A-Za-z][\w-]*==\d[\w.+-]*[\s,]*)+$")


def _scoped(pattern: str) -> str:
    return f"(?i:{pattern[4:]})" if pattern.startswith("(?i)") else f"(?:{pattern})"


EVENT_ANY = "|".join(_scoped(p.pattern) for p in (HARDWARE, OOM, _ERRORISH, EXC_LINE, _NAN_TEXT, _SAVE, _LOAD,
                                                  _JOB_END)) + r"|Namespace\(|=="
"""One pattern (Python ``re`` and Rust ``regex``) for a stripped line that :func:`parse_line` or
:func:`is_error_line` may take: a line it does not match is neither (lets a block of lines skip both)."""


_RANK_OF = re.compile(r"^(?:\[(?:rank|default|Rank)\s*(\d+)\]:\s?|(\d{1,5}):\s(?=\s*\S))")


def clean_rank(line: str) -> tuple[str, int | None]:
    """:func:`clean` and the rank of the prefix it removed (``None``: no rank prefix)."""
    rank = None
    if line[:1] in "[0123456789":
        m = _RANK_OF.match(line if "\x1b" not in line else ANSI.sub("", line))
        if m:
            rank = int(m.group(1) or m.group(2))
    return clean(line), rank


def clean(line: str) -> str:
    """Remove ANSI escapes and one launcher prefix (``[rank0]:``, ``[default7]:``, ``0: ``)."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    if line[:1] in "[0123456789":
        line = _PREFIX.sub("", line, count=1)
    return line.rstrip()


def wall_time(line: str) -> float | None:
    """Seconds since epoch (read as UTC) of a timestamp near the start of the line, or ``None``."""
    head = line[:64]
    m = _TS_ISO.search(head)
    if m:
        y, mo, d, h, mi, s, frac = m.groups()
    else:
        m = _TS_US.search(head)
        if not m:
            return None
        mo, d, y, h, mi, s = m.groups()
        frac = None
    try:
        t = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return t + (float("0." + frac) if frac else 0.0)


def to_num(text: str) -> float | None:
    """A logged number (``1,234``, ``2.3E+00``, ``nan``, ``12.3%``, ``12.34GiB``) as float, or ``None``."""
    t = text.strip().rstrip("%").replace(",", "")
    t = re.sub(r"(?i)(?:ms|s|gib|gb|mib|mb|x)$", "", t).strip()
    try:
        return float(t)
    except ValueError:
        return None


def step_in(text: str) -> int | None:
    """The first step-like number in a line (``step_10.pt``, ``at iteration 5``, ``@ 9 updates``)."""
    m = _STEP_NUM.search(text)
    if not m:
        return None
    return int(next(g for g in m.groups() if g is not None))


def error_kind(text: str) -> str:
    """``hardware_error``, ``oom`` or ``error`` for an error message."""
    if HARDWARE.search(text):
        return "hardware_error"
    if OOM.search(text):
        return "oom"
    return "error"


def is_error_line(text: str) -> bool:
    """True for a line that reports an error outside a Python traceback."""
    s = text.strip()
    return bool(HARDWARE.search(s) or OOM.search(s) or _ERRORISH.match(s) or EXC_LINE.match(s))


def parse_line(line: str, state: dict, *, nan_text: bool = True) -> LineRecord | None:
    """Framework-neutral lines: checkpoint load/save, resume, NaN notices, job end, versions.

    Args:
        line: A cleaned line.
        state: Per-file state (unused).
        nan_text: Whether to take a line that says the loss is NaN (``False``: leave it to the metric
            readers first, so that ``step 5 | loss nan`` keeps its row).

    Returns:
        A record, or ``None``.
    """
    s = line.strip()
    if not s:
        return None
    i = s.find("Namespace(")
    if i >= 0 and s.endswith(")"):
        cfg = parse_repr(s[i:])
        if isinstance(cfg, dict):
            return LineRecord("common", config=cfg, ns="args", launch=True)
    if _LOAD.search(s) and "shards" not in s and "Loading checkpoint shards" not in s:
        step = step_in(s[_LOAD.search(s).start():])  # type: ignore[union-attr]
        if step is not None or re.search(r"(?i)resum", s):
            return LineRecord("common", step=step, resume=True, events=[("checkpoint_loaded", s[:300], step)])
    if _SAVE.search(s) and not s.lower().startswith(("loading", "load ")):
        return LineRecord("common", events=[("checkpoint_saved", s[:300], step_in(s))])
    if _JOB_END.search(s):
        return LineRecord("common", events=[("job_end", s[:300], None)])
    if nan_text and _NAN_TEXT.search(s):
        return LineRecord("common", events=[("nan_detected", s[:300], step_in(s))])
    if "==" in s and _VERSIONS_LINE.match(s):
        return LineRecord("common", meta={"versions": dict(_VERSIONS.findall(s))})
    return None
