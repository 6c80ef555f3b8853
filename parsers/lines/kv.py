r"""The general metric reader for text lines: any ``key sep value`` grammar, one line or a million at once.

A *pair* is a key, a separator and a number:

- key: a name (``loss``, ``train/box_loss``, ``lm loss``, ``Prec@1``; up to four words), optionally quoted
  (``'loss'``, ``"loss"``: Python-dict and JSON objects anywhere in a line) and optionally followed by a
  parenthesised note (``acc (higher is better) : 0.49``);
- separator: ``=``, ``:`` (spaces around allowed) or a run of spaces/tabs (``loss 2.3``);
- value: a decimal or scientific number, ``nan``/``inf``/``infinity`` in any case, ``1,234`` thousands,
  the first element of a list (``lr=[5e-05, 5e-05]``), optionally quoted, a step fraction ``N/M``
  (``step:12/6200``), and a unit (``ms``, ``s``, ``%``, ``GiB``...: the value is kept as logged, the
  unit recorded) or a magnitude (``K``, ``M``, ``B``: multiplied out);
- the pairs of a line are separated by anything that is not a pair: ``|``, ``,``, ``;``, tabs, runs of
  spaces, brackets; a key may be followed directly by a bracket (``Step[0100/0196]``), and a line that
  starts with a bare ``[N/M]`` has step N.

A line is a *metric line* when one pair is a step (:data:`STEP_KEYS`, or a multi-word key ending in one:
``global step``, ``validate step``) and at least one other pair is a number; or, without a step, when it
carries a loss or perplexity pair (``chosen: 0.1, rejected: 0.0, loss: 0.69``, ``ppl: 2.01``): such a line
belongs to the last step seen. Keys that are not measurements are dropped (:data:`NOT_METRICS`: ranks,
pids, ``logging.py:96`` source locations).

The same grammar is used twice, so that both give the same rows: :func:`parse_line` for one line (the
:mod:`parsers.lines` contract) and :func:`parse_block` for a polars Series of lines, vectorised with
polars' string kernels (Rust ``regex``; the patterns below use no look-around for that reason). The
text reader (:mod:`parsers.textlog`) sends the lines no framework module claims through
:func:`parse_block`, which is what makes it fast.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

import polars as pl

from parsers.lines import LineRecord, metric
from parsers.lines.common import wall_time

STEP_KEYS = frozenset({
    "step", "global_step", "global step", "globalstep", "iteration", "iter", "it",
    "num_updates", "update", "updates", "current_steps", "current_step", "_step", "s", "train_step",
    "trainer/global_step", "batch", "optimizer_step",
})
"""Keys that name the step. ``epoch`` is a step only when nothing else is (see :data:`EPOCH_KEYS`)."""
EPOCH_KEYS = frozenset({"epoch", "ep", "episode"})
"""An outer-loop counter: the step of a line that has no other (an RL script's ``Episode 3/500 | Loss: 1.7``)."""
NOT_METRICS = frozenset({"rank", "local_rank", "global_rank", "pid", "gpu", "device", "node", "worker", "tid",
                         "line", "port", "seed"})
"""Keys dropped from a metric line: identifiers, not measurements."""
_LOSSY = re.compile(r"(?i)loss|ppl|perplexity")
CODE = (r"^\s*(?:def |class |if |elif |else:|for |while |return |import |from \S+ import |print\(|#|@\w|with |"
        r"assert |raise |try:|except|lambda )|^\s+[A-Za-z_][\w.\[\]]*\s*[-+*/]?=\s|^\s*[\w.]+\s*:\s*\w+\s*=")
"""Python source (a script that printed itself before training): never a metric line."""
_CODE = re.compile(CODE)

_NUM = (r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
        r"|(?i:nan|inf(?:inity)?))")
_WORD = r"[A-Za-z_][A-Za-z0-9_./@-]*"
PAIR = (rf"['\"]?({_WORD}(?: {_WORD}){{0,3}})['\"]?(?:\s*\([^()]{{0,40}}\))?"
        rf"(?:\s*[:=]\s*\[?|[ \t]+\[?|\[)\s*['\"]?({_NUM})(?:\s*/\s*(\d+))?['\"]?"
        r"(ms|s|%|GiB|GB|MiB|MB|KiB|KB|K|M|B|G|x|it/s|tok/s)?(?:[\s,|;:\])}'\"]|$)")
"""One pair; groups: key, value, fraction denominator, unit. Valid in Python ``re`` and Rust ``regex``."""
_PAIR = re.compile(PAIR)
CONTINUATION = (rf"^[ \t]+['\"]?{_WORD}(?: {_WORD}){{0,3}}['\"]?(?:\s*\([^()]{{0,40}}\))?\s*[:=]\s*['\"]?{_NUM}['\"]?"
                r"(?:ms|s|%|GiB|GB|MiB|MB|KiB|KB|K|M|B|G|x|it/s|tok/s)?[ \t]*,?$")
"""An indented line that is one ``key=value`` / ``key: value`` pair and nothing else: the rest of the record
its step line above began (OLMo's ``[step=10/10000,epoch=0]`` then ``    train/CrossEntropyLoss=9.064``,
one pair per line). Valid in Python ``re`` and Rust ``regex``; see :func:`join_continuations`."""
_CONT = re.compile(CONTINUATION)
_EPOCH_HEADER = re.compile(r"(?i)\b(?:epoch|ep)\s*[:=#]?\s*\[?\s*\d+\s*(?:/\s*\d+)?\s*\]?[^A-Za-z0-9]*$")
"""A line that ends with its epoch and holds no other pair (``epoch   1``, ``===> Epoch 3/10 ===``)."""
LEAD = r"^(\s*)\[(\d+)/(\d+)\]"
"""A line that starts with a bare ``[N/M]`` (``[100/200000] Train loss: ...``): N is the step."""
LEAD_REPL = ("\\1step \\2/\\3 ", "${1}step ${2}/${3} ")  # Python re, Rust regex
_LEAD = re.compile(LEAD)
EPOCH_ITER = r"(?i)(epoch(?:\s*\([A-Za-z]+\))?\s*:?\s*)\[\s*(\d+)\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]"
"""An epoch followed by a bracketed ``[N/M]`` (mmengine ``Epoch(train) [3][50/500]``, ``Epoch: [3] [ 50/500]``):
iteration N of M within it."""
EPOCH_ITER_REPL = ("\\1[\\2/\\2] iter [\\3/\\4]", "${1}[${2}/${2}] iter [${3}/${4}]")  # Python re, Rust regex
_EPOCH_ITER = re.compile(EPOCH_ITER)
NESTED = r"\[\s*(\d+)\s*/\s*(\d+)\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]"
"""Two bracketed fractions in a row, ``[e/E][i/M]`` (DCGAN ``[0/25][0/782]``, Swin/X-CLIP ``Train: [0/50][0/6]``):
the outer loop (epoch e of E) and iteration i of M within it."""
NESTED_REPL = (" epoch [\\1/\\2] iter [\\3/\\4]", " epoch [${1}/${2}] iter [${3}/${4}]")
_NESTED = re.compile(NESTED)
EPOCH_THEN_ITER = (r"(?i)\b(epoch\s*[:=]?\s*)(\d+)(\s*[-|,;]?\s*(?:iter|iteration|it|batch)\s*[:=]?\s*\d+\s*/\s*\d+)")
"""A whole epoch without a total, then an iteration counter ``N/M`` (flair ``epoch 1 - iter 14/149``): the counter
restarts every epoch, so it is iteration N of M within the epoch (the epoch gets a fraction, as above)."""
EPOCH_THEN_ITER_REPL = ("\\1\\2/\\2\\3", "${1}${2}/${2}${3}")  # Python re, Rust regex
_EPOCH_THEN_ITER = re.compile(EPOCH_THEN_ITER)
DURATION = r"(?:\d+ days?, )?\d+:\d+:\d+"
"""A duration ``h:mm:ss`` or ``d days, h:mm:ss`` (``eta: 4:59:11``, ``time: 1 day, 0:02:03``): the pair pattern
would read its first number (``eta`` = 4); it is marked so that no pair is read. A clock time is marked too (no
key reads it; wall times are taken from the line as logged). Any digit count: the lines of one shape must all be
rewritten alike, :mod:`parsers.lines.kv_bulk` reads them by one plan."""
DURATION_REPL = ("~\\g<0>", "~${0}")  # Python re, Rust regex
_DURATION = re.compile(DURATION)
_LEVEL = r"(?:INFO|WARNING|WARN|DEBUG|ERROR|CRITICAL|FATAL|TRACE|SUCCESS|NOTICE)"
_FIELD = r"[A-Za-z_][A-Za-z0-9_.@<>-]*"
_SEP = r"[\t |\[\]-]+"
SOURCE_LOCATION = rf"({_FIELD}:[A-Za-z_<>][A-Za-z0-9_.@<>-]*):([0-9]+)"
"""A ``module:function:line`` source location (loguru ``yolox.core.trainer:after_iter:246``): a key glued to its
colons is a place in the code, not a metric pair."""
SOURCE_LOCATION_REPL = ("\\1:~\\2", "${1}:~${2}")  # Python re, Rust regex
RECORD_PREFIX = (rf"({_FIELD}):([0-9]+)({_SEP})(?:({_FIELD}:)([0-9]+)({_SEP}))?({_LEVEL}\b)")
"""One or two ``name:N`` fields glued to their colon (no space) and then the record's level word: the fields of a
log-record prefix (OLMo ``host-03:0<TAB>olmo.train:990<TAB>INFO``: hostname:rank, logger:lineno), not metric pairs.
A glued pair after the level, in the message (modded-nanogpt ``step:10/100 train_loss:3.2``), is one."""
RECORD_PREFIX_REPL = ("\\1:~\\2\\3\\4~\\5\\6\\7", "${1}:~${2}${3}${4}~${5}${6}${7}")  # Python re, Rust regex
LEVELS = ("INFO", "WARNING", "WARN", "DEBUG", "ERROR", "CRITICAL", "FATAL", "TRACE", "SUCCESS", "NOTICE")
"""Both rules apply to a log record only: a line that holds one of these level words (a literal test, cheap)."""
LEVEL_ANY = "|".join(LEVELS)
PREFIX_ANY = rf"{SOURCE_LOCATION}|{_FIELD}:[0-9]+{_SEP}(?:{_FIELD}:[0-9]+{_SEP})?{_LEVEL}\b"
"""Either of the two (a match test without capture groups: which lines to rewrite)."""
PREFIX_SHAPE = PREFIX_ANY.replace("0-9", "0-9#")
""":data:`PREFIX_ANY` over a line's shape (digit runs as ``#``, :data:`parsers.lines.kv_bulk.SHAPE`): it matches
the shape of every line :data:`PREFIX_ANY` matches, so the bulk reader tests each shape once."""
_SOURCE_LOCATION = re.compile(SOURCE_LOCATION)
_RECORD_PREFIX = re.compile(RECORD_PREFIX)
_PREFIX_ANY = re.compile(PREFIX_ANY)
CANDIDATE = (r"(?i)(?:(?:^|[^A-Za-z0-9])(?:step|steps|iter|iters|iteration|it|updates?|epoch|ep|batch|s)|globalstep)"
             r"['\"]?(?:[ \t]*\([^()]{0,40}\))?[ \t]*[:=#]?[ \t]*['\"]?\[?[ \t]*[0-9]"
             r"|(?:loss|ppl|perplexity)[A-Za-z0-9_./@-]*['\"]?(?:[ \t]*\([^()]{0,40}\))?(?:[ \t]*[:=][ \t]*|[ \t]+)"
             r"['\"]?[-+]?(?:[0-9]|\.[0-9]|nan|inf)")
"""A cheap prefilter: lines that may be metric lines (a step-like key before a number, or a loss pair)."""
_CAND = re.compile(CANDIDATE)
_MAGNITUDE = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
_UNITS = {"ms", "s", "%", "GiB", "GB", "MiB", "MB", "KiB", "KB", "x", "it/s", "tok/s"}


def _value(text: str) -> float:
    t = text.replace(",", "").lower()
    return float(t)  # float() reads nan, inf, infinity in any case


@lru_cache(maxsize=8192)
def classify(key: str) -> tuple[str, str]:
    """What a key is: ``("step", ...)``, ``("epoch", ...)``, ``("drop", ...)`` or ``("metric", name)``.

    Args:
        key: The key as logged (quotes removed).

    Returns:
        ``(kind, canonical name)``; the name is the canonical metric for ``"metric"``.
    """
    low = key.lower().strip()
    last = low.rsplit(" ", 1)[-1]
    if low in STEP_KEYS or (" " in low and last in ("step", "iteration", "iter")):
        return "step", low
    if low in EPOCH_KEYS:
        return "epoch", low
    if low in NOT_METRICS or low.endswith(".py") or re.search(r"\.py:\d*$", low):
        return "drop", low
    return "metric", metric(key, None)[0]


def _scale(value: float, unit: str | None) -> float:
    if unit and unit in _MAGNITUDE:
        return value * _MAGNITUDE[unit]
    return value


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one line with the general grammar.

    Args:
        line: A cleaned line (ANSI escapes and rank prefixes removed).
        state: Per-file state: ``kv_units`` (key -> unit as logged) and ``kv_total_steps`` are filled in.

    Returns:
        A record with the step (``None``: the last step seen) and the metric pairs, or ``None`` when the
        line is not a metric line.
    """
    if not _CAND.search(line) or _CODE.search(line):
        return None
    raw = line
    if "]" in line:  # nested counters: ``[3/25][50/500]``, ``Epoch [3][50/500]`` are iteration 50 of epoch 3
        line = _EPOCH_ITER.sub(EPOCH_ITER_REPL[0], _NESTED.sub(NESTED_REPL[0], line, count=1), count=1)
    if "/" in line:  # ``epoch 3 - iter 50/500``: iteration 50 of epoch 3
        line = _EPOCH_THEN_ITER.sub(EPOCH_THEN_ITER_REPL[0], line, count=1)
    if ":" in line:  # ``eta: 4:59:11`` is a duration, not eta = 4
        line = _DURATION.sub(DURATION_REPL[0], line)
        if any(w in line for w in LEVELS) and _PREFIX_ANY.search(line):  # ``olmo.train:990<TAB>INFO``: no pairs
            line = _RECORD_PREFIX.sub(RECORD_PREFIX_REPL[0], _SOURCE_LOCATION.sub(SOURCE_LOCATION_REPL[0], line))
    if line.lstrip().startswith("["):
        line = _LEAD.sub(LEAD_REPL[0], line, count=1)
    step, step_frac, epoch, epoch_frac, out, lossy = _pairs(line, state)
    if (step is not None and step_frac and epoch_frac and epoch is not None and math.isfinite(epoch)
            and epoch == int(epoch)):  # ``Epoch[3/100], Step[0050/0196]``: the step counts within the epoch
        step = int(epoch) * step_frac + step
        state["kv_step_within_epoch"] = True
    by_epoch = None
    if step is None and epoch is not None and out and any(n != "epoch" for n, _, _ in out):
        if math.isfinite(epoch) and epoch == int(epoch):  # ``Epoch 3 | loss 1.2``: the epoch is the step
            step = int(epoch)
            by_epoch = epoch
            state["kv_epoch_steps"] = True
    if not any(n != "epoch" for n, _, _ in out):
        if step is None and epoch is not None and math.isfinite(epoch) and epoch == int(epoch) \
                and _EPOCH_HEADER.search(line):
            step = int(epoch)  # ``epoch   3`` alone on its line: the epoch is the step of the lines below
            state["kv_epoch_steps"] = True
        if step is None:
            return None
        # a step header (no metric): its step is the step of the step-less metric lines below it
        return LineRecord("generic", step=step, metrics=[], wall_time=wall_time(raw))
    if step is None and not lossy:
        return None
    events = [("nan_detected", nonfinite_message(t, v), step) for n, t, v in out
              if v is not None and not math.isfinite(v) and is_objective(n)]
    return LineRecord("generic", step=step, metrics=out, events=events, wall_time=wall_time(raw), epoch=by_epoch)


def _pairs(line: str, state: dict) -> tuple[int | None, int | None, float | None, bool, list, bool]:
    """The pairs of a line: ``(step, its N/M denominator, epoch, the epoch has one, metrics, a loss is among them)``.

    The first step pair that is a whole number >= 0 is the step; the first epoch pair is the epoch (also a
    metric); identifiers (:data:`NOT_METRICS`) are dropped; units are recorded in ``state["kv_units"]``.
    """
    step: int | None = None
    step_frac: int | None = None
    epoch: float | None = None
    epoch_frac = False
    out = []
    lossy = False
    for m in _PAIR.finditer(line):
        key, val, frac, unit = m.groups()
        kind, name = classify(key)
        try:
            v = _scale(_value(val), unit)
        except ValueError:
            continue
        if kind == "step":
            if step is None and math.isfinite(v) and v == int(v) and v >= 0:
                step = int(v)
                if frac:
                    step_frac = int(frac)
                    state["kv_total_steps"] = int(frac)
            continue
        if kind == "epoch":
            if epoch is None:
                epoch = v
                epoch_frac = frac is not None
            out.append(metric(key, v, "epoch"))
            continue
        if kind == "drop":
            continue
        if unit in _UNITS:
            state.setdefault("kv_units", {})[key] = unit
        lossy = lossy or bool(_LOSSY.search(key))
        out.append(metric(key, v, name))
    return step, step_frac, epoch, epoch_frac, out, lossy


def is_code(line: str) -> bool:
    """True for a line of Python source (:data:`CODE`)."""
    return bool(_CODE.search(line))


def is_candidate(line: str) -> bool:
    """True for a line that may be a metric line (:data:`CANDIDATE`)."""
    return bool(_CAND.search(line))


def is_objective(name: str) -> bool:
    """True for a canonical loss-family name (``loss``, ``loss/<part>``, ``eval_loss``, ``ppl``...)."""
    return name.split("/", 1)[0] in ("loss", "eval_loss", "ppl", "eval_ppl")


def nonfinite_message(tag: str, value: float) -> str:
    """The ``nan_detected`` message of a metric line whose loss is not finite."""
    return f"{tag} = {value} on a metric line"


def meta_of(state: dict[str, Any]) -> dict[str, Any]:
    """Facts the general reader found (units, total steps, epoch-indexed lines) for ``ParseResult.meta``."""
    meta: dict[str, Any] = {}
    if state.get("kv_units"):
        meta["units"] = dict(state["kv_units"])
    if state.get("kv_total_steps"):
        meta["total_steps"] = state["kv_total_steps"]
    if state.get("kv_epoch_steps"):
        meta["step_unit"] = "epoch"
    if state.get("kv_step_within_epoch"):
        meta["step_unit"] = "batch within epoch, numbered epoch x batches per epoch + batch"
    return meta


def join_continuations(lines: list[str]) -> list[str]:
    """``lines`` with each run of :data:`CONTINUATION` lines appended to the metric line above it.

    The step line (:data:`CANDIDATE`) that heads the run gets `` key=value`` of every line of the run, the
    run's lines become empty (counted as blank): one record per step, read by the same grammar. A run
    under any other line (a YAML dump's ``  d_model: 768``) is left as it is.

    Args:
        lines: Cleaned lines of one block, in order.

    Returns:
        The lines, the same count, joined where a run of continuation lines follows a step line.
    """
    out = list(lines)
    head = -1
    for i, line in enumerate(lines):
        if line and line[0] in " \t" and _CONT.match(line) and not _CODE.search(line):
            if head >= 0:
                out[head] = out[head] + "  " + line.strip()
                out[i] = ""
            continue
        head = i if (_CAND.search(line) and not _CODE.search(line)) else -1
    return out


def late_rewrites(text: pl.Series, code: pl.Series, uniq: pl.Series) -> pl.Series:
    """The rewrites of :func:`parse_line` that :mod:`parsers.lines.kv_bulk` makes once the shapes are known.

    A leading ``[N/M]`` becomes ``step N/M`` (:data:`LEAD`), and the log-record prefix fields are marked
    (:func:`mark_prefix_fields`); arguments as there.
    """
    return mark_prefix_fields(text.str.replace(LEAD, LEAD_REPL[1]), code, uniq)


def mark_prefix_fields(text: pl.Series, code: pl.Series, uniq: pl.Series) -> pl.Series:
    """:data:`RECORD_PREFIX` and :data:`SOURCE_LOCATION` marked in many lines so that no pair reads them.

    What :func:`parse_line` does line by line, for :mod:`parsers.lines.kv_bulk`: tested once per shape (``uniq``;
    ``code``: each line's shape index), rewritten on the lines of the shapes that match.

    Args:
        text: The lines (Utf8).
        code: Each line's index into ``uniq`` (UInt32).
        uniq: The distinct shapes (:data:`parsers.lines.kv_bulk.SHAPE`).

    Returns:
        ``text``, or a copy with those lines rewritten.
    """
    hit = (uniq.str.contains(LEVEL_ANY) & uniq.str.contains(PREFIX_SHAPE)).arg_true()
    if hit.len() == 0:
        return text
    idx = code.is_in(hit.cast(pl.UInt32).implode()).arg_true()
    if idx.len() == 0:
        return text
    part = (text.gather(idx).str.replace_all(SOURCE_LOCATION, SOURCE_LOCATION_REPL[1])
            .str.replace_all(RECORD_PREFIX, RECORD_PREFIX_REPL[1]))
    return text.clone().scatter(idx, part)
