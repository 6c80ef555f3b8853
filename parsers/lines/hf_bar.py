r"""The global step of HF Trainer stdout dict lines, from the tqdm training bar around them (docs/formats.md#hf-stdout).

Recent Trainer versions print no step on their log dicts (``{'loss': ..., 'epoch': 0.04}``). The Trainer's
tqdm bar counts optimizer steps; :func:`bars_in` finds the bars of a block (vectorised), and at the end of
the file :func:`bar_steps` dates each dict: the bar's count redrawn after it, or the epoch times the steps
per epoch when stdout was flushed in bursts. :mod:`parsers.lines.hf_stdout` reads the dicts.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from parsers.lines.pyrepr import to_float

BAR = r"(\d{1,3})%(?:\|[^|]*\|)?[ \t]*(\d+)/(\d+)[ \t]*\[[^\]]*\]"
"""A tqdm bar's ``PCT%|bar| N/TOTAL [elapsed<remaining, rate]`` (the ``|bar|`` is absent in some notebook
captures: ``100% 31/31 [00:08<00:00, 3.76it/s]``); groups: percentage, count, total. Python ``re`` and Rust
``regex``."""


def quantum(v: object) -> float | None:
    """The printed precision of a logged epoch: ``0.04`` -> 0.01; a ``%.4g`` string ``'0.0179'`` -> 1e-05."""
    x = to_float(v)
    if x is None or not math.isfinite(x) or x <= 0:
        return None
    if isinstance(v, str):  # recent versions: f"{v:.4g}", four significant digits
        return 10.0 ** (math.floor(math.log10(x)) - 3)
    text = repr(float(x))
    if "e" in text:
        mant, _, exp = text.partition("e")
        return 10.0 ** (int(exp) - len(mant.partition(".")[2]))
    return 10.0 ** -len(text.partition(".")[2])


ISOLATED = 0.9
"""Share of a launch's train dicts that must each be followed by a training bar before the next dict for the
bar's count to be the dict's step (a dict written as it happens: ``tqdm.write`` redraws the bar at the
trainer's global step). Our choice; below it the dicts were flushed in bursts (a block-buffered stdout)."""


def bar_steps(dicts: list[tuple], bars: tuple, summary: float | None) -> tuple[list[int | None], dict | None]:
    """The global step of each HF Trainer dict line, from the tqdm training bar printed around it.

    The Trainer's bar counts optimizer steps (``N/TOTAL``, TOTAL = ``max_steps``) and is redrawn at the
    trainer's global step right after each dict (``ProgressCallback.on_log`` writes through ``tqdm.write``).
    When every dict is followed by a training bar before the next dict, that bar's count is the dict's step.
    When the dicts came in bursts (stdout block-buffered, the bar on unbuffered stderr), a bar after a dict
    is only an upper bound: the step is ``epoch x steps per epoch``, the steps per epoch being ``TOTAL /``
    the final epoch of the summary dict when the bar reached TOTAL, else the tightest bound
    ``count / (epoch - precision / 2)`` over the dicts; where the epoch is printed too coarsely for a single
    step (``round(epoch, 2)``), the steps are put on the logging grid their spacing shows, when every dict
    fits it (one dict per grid point, in order). Evaluation dicts take the step of the train dict before them.

    Args:
        dicts: Per dict line, in file order: ``(lineno, epoch, epoch precision, is_eval, glued bar count,
            glued bar total, segment)``.
        bars: ``(lineno, count, total)`` numpy arrays of the bars, in file order.
        summary: The ``epoch`` of the end-of-training summary dict, if one was printed.

    Returns:
        The new step per dict (``None``: keep the one the line reader gave) and the step axis for the meta
        (``None`` when no dict was dated by a bar).
    """
    out: list[int | None] = [None] * len(dicts)
    hows = set()
    for seg in sorted({d[6] for d in dicts}):
        idx = [i for i, d in enumerate(dicts) if d[6] == seg and not d[3]]
        steps, how = _segment_steps([dicts[i] for i in idx], bars, summary) if idx else (None, "")
        if steps is None:
            continue
        hows.add(how)
        for i, s in zip(idx, steps, strict=True):
            out[i] = s
    last = None
    for i, d in enumerate(dicts):  # an evaluation dict belongs to the last train step
        if d[3]:
            out[i] = last
        elif out[i] is not None:
            last = out[i]
    if not hows:
        return out, None
    return out, {"column": "; ".join(sorted(hows)), "kind": "optimizer_step"}


def _segment_steps(ds: list[tuple], bars: tuple, summary: float | None) -> tuple[list[int] | None, str]:
    """The steps of one launch's train dicts (see :func:`bar_steps`); ``None`` where they cannot all be dated."""
    ln, cnt, tot = bars
    total = _training_bar(ln, cnt, tot, ds[0][0], ds[-1][0])
    if total is None:
        return None, ""
    sel = np.flatnonzero(tot == total)
    s_ln, s_cnt = ln[sel], cnt[sel]
    nb: list[tuple[int | None, int | None]] = []  # (count, line) of the first training bar after the dict
    for d in ds:
        k = int(np.searchsorted(s_ln, d[0], side="right"))
        after = (int(s_cnt[k]), int(s_ln[k])) if k < len(s_ln) else (None, None)
        nb.append((d[4], None) if d[5] == total and d[4] is not None else after)
    # a bar on the next dict's line came before it (a dict ends its line: ``\r bar\r bar\r{dict}\n``)
    alone = sum(1 for j in range(len(ds) - 1) if nb[j][1] is not None and nb[j][1] <= ds[j + 1][0])
    if len(ds) == 1 or alone >= ISOLATED * (len(ds) - 1):
        steps: list[int | None] = [c for c, _ in nb]
        how = "the tqdm bar count N/TOTAL redrawn after each dict"
    else:
        steps, how = _epoch_steps(ds, [c for c, _ in nb], total, summary,
                                  bool(len(s_cnt)) and int(s_cnt.max()) >= total)
    if any(s is None for s in steps) or any(b < a for a, b in zip(steps, steps[1:], strict=False)):
        return None, ""  # not every dict dated, or dates that go back: keep the running index
    return steps, how


def _training_bar(ln: object, cnt: object, tot: object, first: int, last: int) -> int | None:
    """The total of the training bar among the bars from line ``first`` to the next bar after line ``last``.

    An evaluation or data bar starts again from 0 each time it is drawn; the training bar's count only goes
    up within a launch: the total whose count goes back least often, the most drawn among those.
    """
    lo, hi = np.searchsorted(ln, [first, last], side="left")
    hi = min(len(ln), int(np.searchsorted(ln, last, side="right")) + 1)
    lo = max(0, int(lo) - 1)
    if hi <= lo:
        return None
    best = None
    for t in np.unique(tot[lo:hi]).tolist():
        c = cnt[lo:hi][tot[lo:hi] == t]
        key = (int((np.diff(c) < 0).sum()), -len(c))
        if best is None or key < best[0]:
            best = (key, int(t))
    return best[1]


def _epoch_steps(ds: list[tuple], upper: list[int | None], total: int, summary: float | None,
                 completed: bool) -> tuple[list[int | None], str]:
    """Steps from the dicts' epochs: ``epoch x steps per epoch`` (see :func:`bar_steps`)."""
    eps = [(d[1], d[2]) for d in ds]
    if any(e is None or q is None for e, q in eps):
        return [None] * len(ds), ""
    if summary and completed:
        spe = total / summary
        how = f"epoch x {spe:.6g} steps per epoch (the tqdm bar's total {total} / the final epoch {summary:g})"
    else:
        bounds = [u / (e - q / 2) for (e, q), u in zip(eps, upper, strict=True) if u is not None and e > q]
        if not bounds:
            return [None] * len(ds), ""
        spe = min(bounds)
        how = f"epoch x {spe:.6g} steps per epoch (the tightest bound of the tqdm bar counts after the dicts)"
    x = [e * spe for e, _ in eps]
    steps = [round(v) for v in x]
    coarse = max(q for _, q in eps) * spe
    if coarse > 1 and len(x) >= 3:  # the epoch cannot tell single steps: the logging grid
        g = round((x[-1] - x[0]) / (len(x) - 1))
        k = [round(v / g) for v in x] if g > 1 else []
        if k and all(b > a for a, b in zip(k, k[1:], strict=False)):  # one dict per grid point, in order
            steps = [g * j for j in k]
            how += f", on the logging grid of {g} steps"
    return [min(s, u) if u is not None else s for s, u in zip(steps, upper, strict=True)], how


def bars_in(lines: object, linenos: object) -> tuple | None:
    """The tqdm bars among cleaned lines (a polars Series), vectorised: ``(lineno, count, total)`` arrays or None.

    Args:
        lines: The cleaned lines of a block (``pl.Series`` of str).
        linenos: Their line numbers (a sequence of int, the same length).
    """
    idx = lines.str.contains("%", literal=True).arg_true()
    if not idx.len():
        return None
    g = (pl.DataFrame({"t": lines.gather(idx)})
         .select(pl.col("t").str.extract_groups(BAR).alias("g")).unnest("g"))
    g.columns = ["pct", "n", "total"]
    ok = g.get_column("n").is_not_null().to_numpy()
    if not ok.any():
        return None
    ln = np.asarray(linenos, dtype=np.int64)[idx.to_numpy()[ok]]
    n = g.get_column("n").to_numpy()[ok].astype(np.int64)
    t = g.get_column("total").to_numpy()[ok].astype(np.int64)
    return ln, n, t
