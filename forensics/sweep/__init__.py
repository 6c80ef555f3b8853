"""Learning-rate sweeps: final loss against lr, LR sensitivity, largest stable lr, size trends and predictions.

``sweep(root)`` returns the JSON object of DESIGN.md section 7 (``sweep``). Runs are found at any depth
under ROOT (:func:`forensics.layout.find_runs`: a run is the folder holding one run's logs, so
``ROOT/sweep_a/width_32/lr_0.01/`` works as well as ``ROOT/run_1``). Each run's peak lr and settings come
from its configuration (:func:`forensics.config_diff.extract_config`, plus any other configuration key
that varies across ROOT); a setting no configuration records is read from the run's folder names as a
fallback (``width_32``, ``qkln-off``, ``lr3e-02``, ``d64``..., :data:`NAME_KEYS`), and the report says so.
Runs are grouped by every setting that varies except the lr (the group ``key``); ``nesting`` orders the
settings as the folders nest them and ``tree`` is the nested grouping.

Per run: the final loss L = the last logged ``eval_loss`` when the run logs one (the paper's final
validation loss), else the mean of the finite training losses over the last 5% of the logged points;
``diverged`` when the loss is non-finite anywhere, when L exceeds the initial loss, or when the engine
finds a failure (:func:`forensics.engine.decide`'s ``failure_step``); the divergence step is the first of those.

LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities", arXiv 2309.14322, section 2.2)::

    LR sensitivity = E_{eta in [a, b]} [ min(L(eta), L0) - min_{eta'} L(eta') ]

with L0 the loss at initialisation (a diverged run counts as L0) and the expectation over the swept
(log-spaced) lrs; runs repeated at one lr are averaged first. Lower is flatter. ``lr_sensitivity_common``
takes the expectation over the lrs every group swept, so groups with different grids compare.

Largest stable lr: the largest lr whose runs did not diverge and whose final loss is within
``STABLE_MARGIN`` x (L0 - best loss) of the best loss (our choice: 5%).

Size trends (:func:`size_trends`): for groups that differ only in width (``d_model``) or depth
(``n_layers``), at each lr they share, the growth of the attention logits, output logits and update ratios
(log of the run's max over its first value, and the exponent b of max ~ size^b), extrapolated to the
target size (``--target-width`` or ``--target-params``), and the predicted largest stable lr there
(:func:`predict_stable_lr`), with its uncertainty.

Modules: :mod:`~forensics.sweep.runs` (one run's row), :mod:`~forensics.sweep.groups` (groups, nesting),
:mod:`~forensics.sweep.trends` (size trends), :mod:`~forensics.sweep.predict` (the largest stable lr at a size).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from forensics import SCHEMA_VERSION
from forensics.errors import InputError
from forensics.model import RunData
from forensics.sweep.groups import STABLE_MARGIN, group_summary, nesting, tree, varying_settings
from forensics.sweep.predict import WEAK_SEPARATION, predict_stable_lr
from forensics.sweep.runs import NAME_KEYS, TAIL, TREND_SIGNALS, lr_sensitivity, run_summary, settings_from_name
from forensics.sweep.trends import SIZE_KEYS, params_to_size, size_trends

__all__ = [
    "NAME_KEYS", "SIZE_KEYS", "STABLE_MARGIN", "TAIL", "TREND_SIGNALS", "WEAK_SEPARATION", "find_runs",
    "group_summary", "lr_sensitivity", "params_to_size", "predict_stable_lr", "run_summary", "settings_from_name",
    "size_trends", "sweep",
]


# ----------------------------------------------------------------------------------------------- sweep


def find_runs(root: Path) -> tuple[list[tuple[str, RunData]], list[dict[str, str]]]:
    """Load every run folder under ``root`` (:func:`forensics.layout.find_runs`), named by its relative path."""
    from forensics.api import load
    from forensics.layout import find_runs as layout_find_runs

    runs, skipped = [], []
    for sub in layout_find_runs(root):
        name = sub.relative_to(root).as_posix() if sub != root else sub.name
        try:
            runs.append((name, load(sub)))
        except InputError as exc:
            skipped.append({"what": name, "reason": exc.message})
    return runs, skipped


def sweep(root: str | Path, target_d_model: int | None = None, *, target_width: float | None = None,
          target_params: float | None = None) -> dict[str, Any]:
    """Analyse the lr sweeps under a root (DESIGN.md section 7, ``sweep``).

    Args:
        root: Folder that holds the runs, at any depth.
        target_d_model: Old name of ``target_width``.
        target_width: Width to extrapolate the size trends to.
        target_params: Parameter count to extrapolate to (converted to width or depth).

    Returns:
        ``schema_version``, ``root``, ``groups`` (each: ``key``, ``lr_sensitivity``, ``largest_stable_lr``,
        ``best_lr``, ``runs``), plus ``varying``, ``nesting``, ``tree``, ``size_trends``, ``size_predictions``,
        ``skipped`` and ``notes``.

    Raises:
        InputError: ``root`` is not a folder, or no run below it has a loss and a peak lr.
    """
    path = Path(root).expanduser()
    if not path.is_dir():
        raise InputError(root, "no such folder" if not path.exists() else "not a folder (give the sweep root)")
    target_width = target_width or target_d_model
    loaded, skipped = find_runs(path)
    rows = []
    for name, run in loaded:
        row = run_summary(run, name)
        if row is None:
            skipped.append({"what": name, "reason": "no loss series or no peak lr (config or logged lr)"})
        else:
            rows.append(row)
    if not rows:
        raise InputError(root, "no run folders with a loss and a peak lr found under it")
    notes: list[str] = []
    order, groups, grids = _grouped(rows, notes)
    if len({tuple(g) for g in grids}) > 1:
        common = set.intersection(*(set(g) for g in grids))
        notes.append("the groups swept different lr grids: compare them by lr_sensitivity_common (over the "
                     f"{len(common)} lrs every group swept)")
    if any(len(g["lrs"]) < 2 for g in groups):
        notes.append("some groups hold a single lr: their LR sensitivity is 0 by definition")
    size_varies = [k for k in SIZE_KEYS if k in order]
    if size_varies and target_width is None and target_params is None:
        notes.append(f"several {'/'.join(size_varies)}: give --target-width or --target-params to extrapolate "
                     "the size trends and predict the largest stable lr there")
    vocab = next((r["n_params_hint"]["vocab_size"] for r in rows if r["n_params_hint"].get("vocab_size")), None)
    trends, preds = size_trends(groups, target_width, target_params, int(vocab) if vocab else None)
    for g in groups:
        g.pop("_sizes", None)
    return {"schema_version": SCHEMA_VERSION, "root": str(root), "groups": groups, "varying": order,
            "nesting": order, "tree": tree(groups, order), "size_trends": trends, "size_predictions": preds,
            "target": {"width": target_width, "params": target_params}, "skipped": skipped, "notes": notes}


def _grouped(rows: list[dict[str, Any]], notes: list[str]
             ) -> tuple[list[str], list[dict[str, Any]], list[list[float]]]:
    """(the grouping settings in nesting order, the groups' summaries, each group's lr grid).

    Runs are grouped by every setting that varies except the lr; a setting read from folder names and a
    grouping by folder are added to ``notes``.
    """
    varying, raw_vary = varying_settings(rows)

    def value(r: dict[str, Any], k: str) -> Any:
        return r["config"].get(k) if k in varying else r["raw_config"].get(k)

    keys = varying + raw_vary
    if _repeats_across_folders(rows, keys, value):
        keys.append("sweep_folder")
        for r in rows:
            r["raw_config"]["sweep_folder"] = str(PurePosixPath(r["run"]).parent)
        notes.append("runs with equal recorded settings and lr sit in different folders: grouped by folder "
                     "(repeats, or a setting no configuration records)")
    named = sorted({k for r in rows for k in r["from_name"] if k in keys})
    if named:
        notes.append("read from folder names (no configuration records them): " + ", ".join(named))
    order = nesting(rows, keys, value) if keys else []
    grouped: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for r in rows:
        key = {k: value(r, k) for k in order}
        grouped.setdefault(repr(sorted(key.items(), key=str)), (key, []))[1].append(r)
    grids = [sorted({r["lr"] for r in rs}) for _k, rs in grouped.values()]
    common = sorted(set.intersection(*(set(g) for g in grids))) if grids else []
    groups = []
    for k, rs in grouped.values():
        g = group_summary(k, rs, common)
        g["_sizes"] = {s: rs[0]["config"].get(s) for s in SIZE_KEYS}
        groups.append(g)
    groups.sort(key=lambda g: [repr(g["key"].get(k)) for k in order])
    return order, groups, grids


def _repeats_across_folders(rows: list[dict[str, Any]], keys: list[str], value: Any) -> bool:
    """Whether two sweeps with equal settings sit in different folders (then the folder is part of the key).

    Equal settings and lr in several folders, and not told apart by their seeds.
    """
    if len({str(PurePosixPath(r["run"]).parent) for r in rows}) <= 1:
        return False
    probe: dict[tuple[str, float], list[tuple[str, Any]]] = {}
    for r in rows:
        probe.setdefault((repr([value(r, k) for k in keys]), r["lr"]), []).append(
            (str(PurePosixPath(r["run"]).parent), r["seed"]))
    return any(len({p for p, _ in v}) > 1 and (None in {sd for _, sd in v} or len({sd for _, sd in v}) < len(v))
               for v in probe.values())
