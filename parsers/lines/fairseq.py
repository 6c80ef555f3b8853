"""fairseq and metaseq ``train.log`` lines.

Why a module: fairseq rounds small loss scales to ``loss_scale=0`` (a value, not zero), and its epoch
summary lines repeat the inner lines' names as averages.

Shapes (with or without the ``YYYY-MM-DD hh:mm:ss | INFO | logger |`` prefix):

- ``train_inner | epoch 002:    243 / 356 loss=9.912, nll_loss=8.982, ..., num_updates=590, lr=...,
  gnorm=53.883, loss_scale=0, ...`` (step = ``num_updates``); the old ``| epoch 001:  100 / 5000 loss=...``;
- ``train | epoch 002 | loss 9.803 | ... | num_updates 695`` (end-of-epoch averages, kept as
  ``epoch_avg/<name>``), ``valid | epoch 002 | valid on 'valid' subset | loss 9.393 | ... | num_updates 695``
  (``eval_<name>``);
- metaseq JSON: ``train_inner | {"epoch": 1, "loss": "3.174", ..., "num_updates": "39260", ...}``
  (values are strings), ``valid | {...}``, ``train | {...}``;
- ``NOTE: overflow detected, setting loss scale to: X`` / ``NOTE: gradient overflow detected,
  ignoring gradient, setting loss scale to: X``: an ``overflow_skip`` and a ``loss_scale_change``
  event and a ``loss_scale`` row at the last ``num_updates``;
- ``loaded checkpoint X (epoch 2 @ 580 updates)``, ``saved checkpoint X (epoch 2 @ 695 updates, ...)``;
- the configuration: ``Namespace(...)`` (fairseq) or a dict repr (metaseq) from ``*_cli.train``.

fairseq prints loss scales with no decimals, so ``loss_scale=0`` means "below 0.5": the value is
kept as logged and ``meta["loss_scale_zero_means_small"]`` is set.
"""

from __future__ import annotations

import json
import re

from parsers.lines import LineRecord, metric
from parsers.lines.common import NUM, to_num, wall_time
from parsers.lines.pyrepr import parse as parse_repr
from parsers.lines.pyrepr import to_float

_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \| (?:INFO|WARNING|ERROR|DEBUG) \| "
                     r"([\w.]+) \| ")
_INNER = re.compile(r"^\|?\s*epoch (\d+):\s+(\d+)\s*/\s*(\d+)\s+(.*)$")
_KV = re.compile(rf"(?<![\w/])([A-Za-z_][\w/]{{0,63}})=({NUM}|[\d,.]+)(?=,|\s|$)")
_PIPE_EPOCH = re.compile(r"^\|?\s*epoch (\d+) \|(.*)$")
_NOTE = re.compile(rf"NOTE: (?:gradient )?overflow detected.*setting loss scale to:\s*({NUM})")
_LOADED = re.compile(r"[Ll]oaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates")
_SAVED = re.compile(r"[Ss]aved checkpoint (\S+) \(epoch (\d+) @ (\d+) updates")
_SKIP = {"epoch", "num_updates"}


def _inner_metrics(pairs: list[tuple[str, str]]) -> tuple[int | None, list]:
    step = None
    out = []
    for k, v in pairs:
        x = to_num(v) if not isinstance(v, float) else v
        if k == "num_updates" and x is not None:
            step = int(x)
        if k in _SKIP or x is None:
            continue
        out.append(metric(k, x))
    return step, out


def _json_line(kind: str, body: str, fw: str, ts: float | None) -> LineRecord | None:
    try:
        d = json.loads(body)
    except ValueError:
        d = parse_repr(body)
    if not isinstance(d, dict):
        return None
    strip = f"{kind}_" if kind in ("train", "valid") else None
    orig: dict[str, str] = {}
    pairs = []
    for key, v in d.items():
        k = str(key)
        short = k[len(strip):] if strip and k.startswith(strip) else k
        orig[short] = k
        x = to_float(v)
        if x is not None:
            pairs.append((short, x))
    step, out = _inner_metrics(pairs)  # type: ignore[arg-type]
    if step is None:
        return None
    r = _by_kind(kind, step, out, fw, ts)
    r.metrics = [(n, orig.get(t, t), v) for n, t, v in r.metrics]
    return r


def _by_kind(kind: str, step: int, out: list, fw: str, ts: float | None) -> LineRecord:
    if kind == "valid":
        out = [metric(t, v, "eval_loss" if t == "loss" else f"eval_{t}") for _, t, v in out]
        return LineRecord(fw, step=step, metrics=out, eval=True, wall_time=ts)
    if kind == "train":
        out = [metric(t, v, f"epoch_avg/{t}") for _, t, v in out]
        return LineRecord(fw, step=step, metrics=out, eval=True, wall_time=ts)
    zero = any(t == "loss_scale" and v == 0 for _, t, v in out)
    return LineRecord(fw, step=step, metrics=out, wall_time=ts,
                      meta={"loss_scale_zero_means_small": True} if zero else {})


def _metric_line(logger: str, body: str, fw: str, ts: float | None, state: dict) -> LineRecord | None:
    b = body.strip().lstrip("| ").strip()
    if b.startswith("{"):
        return _json_line(logger or "train_inner", b, fw, ts)
    i = _INNER.match(b)
    if i:
        step, out = _inner_metrics(_KV.findall(i.group(4)))
        if step is None:
            return None
        state["fairseq_inner"] = True
        return _by_kind("train_inner", step, out, fw, ts)
    p = _PIPE_EPOCH.match(b)
    if p:
        pairs = []
        for part in p.group(2).split("|"):
            k, _, v = part.strip().partition(" ")
            if k and v:
                pairs.append((k, v.strip()))
        step, out = _inner_metrics(pairs)
        if step is not None:
            return _by_kind("valid" if "valid on" in b or logger == "valid" else "train", step, out, fw, ts)
    return None


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one fairseq / metaseq line.

    Args:
        line: A cleaned line.
        state: Per-file state: ``fairseq_fw`` (``fairseq`` or ``metaseq``), ``fairseq_inner``.

    Returns:
        A record, or ``None``.
    """
    m = _PREFIX.match(line)
    if m is None and not line.startswith("| ") and "NOTE:" not in line:
        return None
    logger = m.group(1) if m else ""
    if "metaseq" in logger:
        state["fairseq_fw"] = "metaseq"
    fw = state.get("fairseq_fw", "fairseq")
    body = line[m.end():] if m else line
    ts = wall_time(line) if m else None
    if logger in ("train_inner", "train", "valid") or not m:
        r = _metric_line(logger, body, fw, ts, state)
        if r is not None or logger:
            return r
    n = _NOTE.search(body)
    if n:
        scale = float(n.group(1))
        return LineRecord(fw, metrics=[metric("setting loss scale to", scale, "loss_scale")],
                          events=[("overflow_skip", body.strip(), None),
                                  ("loss_scale_change", f"loss scale set to {n.group(1)}", None)],
                          wall_time=ts)
    ld = _LOADED.search(body)
    if ld:
        step = int(ld.group(3))
        return LineRecord(fw, step=step, resume=True, events=[("checkpoint_loaded", body.strip(), step)])
    sv = _SAVED.search(body)
    if sv:
        return LineRecord(fw, events=[("checkpoint_saved", body.strip(), int(sv.group(3)))])
    if logger.endswith("_cli.train"):
        b = body.strip()
        cfg = parse_repr(b) if b.startswith(("Namespace(", "{")) else None
        if isinstance(cfg, dict):
            common = cfg.get("common") if isinstance(cfg.get("common"), dict) else cfg
            prec = "fp16" if common.get("fp16") is True else "bf16" if common.get("bf16") is True else None
            return LineRecord(fw, config=cfg, ns="args", launch=True,
                              meta={"precision": prec} if prec else {})
    if m and "Loading checkpoint" in body:
        return LineRecord(fw)
    return None
