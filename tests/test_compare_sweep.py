"""compare (proxy vs target) and sweep (LR sensitivity): units on hand-made numbers, then the real samples.

Samples: ``sample_logs/proxy_target/{proxy,target}`` (qk-layernorm dropped in the target, the one injected
change) and ``sample_logs/sweep/`` (peak lr x qk-layernorm x d_model), made by
``sample_logs/make_sweep_samples.py``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from forensics.cli import main
from forensics.compare import compare, departure_of, explain
from forensics.config_diff import diff, extract_config, unwrap_wandb
from forensics.model import RunData
from forensics.sweep import lr_sensitivity, sweep
from reports.compare_report import render as render_compare
from reports.sweep_report import render as render_sweep

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
PAIR = SAMPLES / "proxy_target"
SWEEP = SAMPLES / "sweep"


def _run(meta: dict) -> RunData:
    return RunData(run="x", metrics=pl.DataFrame(), events=pl.DataFrame(), meta=meta, sources=[], skipped=[])


# ------------------------------------------------------------------------------------------ LR sensitivity


def test_lr_sensitivity_formula_on_hand_made_numbers() -> None:
    """LR sensitivity = E_lr[min(L, L0)] - min L: NaN and above-L0 runs count as L0; repeats averaged."""
    # E[min(L, L0)] - min L over lrs: (3 + 2 + 5) / 3 - 2, the NaN run counted as L0 = 5
    assert lr_sensitivity([1e-3, 1e-2, 1e-1], [3.0, 2.0, float("nan")], 5.0) == pytest.approx(10 / 3 - 2)
    # a run that ended above its initial loss is capped at L0 too
    assert lr_sensitivity([1e-3, 1e-2, 1e-1], [3.0, 2.0, 9.0], 5.0) == pytest.approx(10 / 3 - 2)
    assert lr_sensitivity([1e-3, 1e-2], [2.5, 2.5], 5.0) == 0.0
    # repeats at one lr (seeds) are averaged before the expectation
    assert lr_sensitivity([1e-3, 1e-3, 1e-2], [2.0, 4.0, 3.0], 5.0) == pytest.approx(0.0)
    assert math.isnan(lr_sensitivity([], [], 5.0))


# ------------------------------------------------------------------------------------------ config


def test_extract_wandb_config_unwraps_values() -> None:
    """W&B ``{key: {value: v}}`` configs are unwrapped; betas split; the bf16 flag gives the precision."""
    cfg = {"_wandb": {"value": {"cli_version": "0.31"}}, "lr": {"value": 3e-4, "desc": None},
           "betas": {"value": [0.9, 0.95]}, "bf16": {"value": True}, "model": {"value": {"hidden_size": 512}}}
    assert unwrap_wandb(cfg)["lr"] == 3e-4
    out = extract_config(_run({"config_files": {"files/config.yaml": cfg}}))
    assert out["peak_lr"] == 3e-4 and (out["beta1"], out["beta2"]) == (0.9, 0.95)
    assert out["precision"] == "bf16" and out["d_model"] == 512


def test_extract_megatron_args_and_warmup_tokens() -> None:
    """Megatron arguments map to canonical keys; warm-up tokens = iters x global batch x seq length."""
    args = {"lr": 1.2e-4, "global_batch_size": 512, "seq_length": 2048, "lr_warmup_iters": 2000, "hidden_size": 4096,
            "num_layers": 32, "num_attention_heads": 32, "qk_layernorm": False, "bf16": True, "adam_eps": 1e-8,
            "init_method_std": 0.02, "clip_grad": 1.0, "lr_decay_style": "cosine", "train_iters": 100000}
    out = extract_config(_run({"by_source": {"train.log": {"args": args}}}))
    assert out["warmup_tokens"] == 2000 * 512 * 2048
    assert out["qk_layernorm"] is False and out["precision"] == "bf16" and out["eps"] == 1e-8
    assert (out["n_layers"], out["n_heads"], out["init_std"], out["total_steps"]) == (32, 32, 0.02, 100000)


def test_extract_hf_training_arguments() -> None:
    """HF TrainingArguments: global batch = per-device x accumulation; warm-up from warmup_ratio."""
    ta = {"learning_rate": 5e-5, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4,
          "warmup_ratio": 0.1, "max_steps": 1000, "fp16": True, "bf16": False, "adam_epsilon": 1e-8,
          "max_grad_norm": 1.0, "lr_scheduler_type": "linear", "optim": "adamw_torch"}
    out = extract_config(_run({"config_files": {"training_args.json": ta}}))
    assert out["global_batch_size"] == 32 and out["warmup_steps"] == 100 and out["precision"] == "fp16"
    assert out["optimizer"] == "adamw_torch" and out["clip_grad_norm"] == 1.0


def test_diff_warmup_in_steps_while_batch_grew() -> None:
    """Warm-up kept in steps while the batch grew 4x is a difference that matters, said so."""
    p = {"warmup_steps": 2000, "global_batch_size": 128, "seq_len": 2048, "warmup_tokens": 2000 * 128 * 2048}
    t = {"warmup_steps": 2000, "global_batch_size": 512, "seq_len": 2048, "warmup_tokens": 2000 * 512 * 2048}
    rows = {d["setting"]: d for d in diff(p, t)}
    assert set(rows) == {"global_batch_size", "warmup_tokens"}
    assert rows["warmup_tokens"]["matters"] and "kept at 2000 steps" in rows["warmup_tokens"]["why"]


def test_diff_switches_dropped_or_added() -> None:
    """Dropped qk-layernorm / z-loss and a changed epsilon matter; an added stabiliser does not."""
    rows = {d["setting"]: d for d in diff({"qk_layernorm": True, "z_loss": 1e-4, "eps": 1e-8},
                                          {"qk_layernorm": False, "z_loss": 0.0, "eps": 1e-6})}
    assert rows["qk_layernorm"]["matters"] and "s3.1.1" in rows["qk_layernorm"]["why"]
    assert rows["z_loss"]["matters"] and "output-logit divergence" in rows["z_loss"]["why"]
    assert rows["eps"]["matters"] and "epsilon" in rows["eps"]["why"]
    added = diff({"qk_layernorm": False}, {"qk_layernorm": True})
    assert len(added) == 1 and not added[0]["matters"]
    assert diff({"peak_lr": 1e-3, "d_model": 64}, {"peak_lr": 1e-3, "d_model": 64}) == []
    width = diff({"d_model": 64}, {"d_model": 4096})[0]
    assert width["matters"] and "Yang et al. 2022" in width["why"]


# ------------------------------------------------------------------------------------------ departure, ranking


def test_departure_is_one_sided_and_sustained() -> None:
    """A sustained rise departs near its start; a lower target, a constant offset or two noisy points do not."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, 201)
    proxy = np.exp(rng.normal(0.0, 0.02, 200)) * 10
    grow = proxy * np.exp(np.clip(steps - 100, 0, None) * 0.05)
    dep = departure_of(steps, proxy, grow)
    assert dep is not None and 100 < dep["step"] <= 110
    assert departure_of(steps, proxy, proxy * 0.1) is None  # below the proxy: not an instability
    blip = proxy.copy()
    blip[50:52] *= 10  # two noisy points are not a departure
    assert departure_of(steps, proxy, blip) is None
    # a constant offset from the start (a wider model's larger initial norm) is not a departure either way
    assert departure_of(steps, proxy, proxy * 0.1, two_sided=True) is None
    sink = proxy * np.exp(-np.clip(steps - 100, 0, None) * 0.05)  # falls away from the proxy after step 100
    assert departure_of(steps, proxy, sink) is None
    dep = departure_of(steps, proxy, sink, two_sided=True)
    assert dep is not None and 100 < dep["step"] <= 110


def _diffs(*settings: str) -> list[dict]:
    return [{"setting": s, "proxy": 1, "target": 2, "matters": True, "why": s} for s in settings]


@pytest.mark.parametrize(("signal", "top"), [("attn_logit_max", "qk_layernorm"), ("log_z", "z_loss"),
                                             ("update_ratio", "peak_lr")])
def test_ranking_follows_the_departing_signal(signal: str, top: str) -> None:
    """The setting whose mechanism predicts the first departing signal ranks first."""
    deps = {signal: {"step": 40, "proxy": 1.0, "target": 3.0}}
    ranked = explain(_diffs("peak_lr", "qk_layernorm", "z_loss"), deps, {"step": 40, "signal": signal}, None)
    assert ranked[0]["setting"] == top
    assert [e["confidence"] for e in ranked] == sorted((e["confidence"] for e in ranked), reverse=True)


# ------------------------------------------------------------------------------------------ real samples


@pytest.fixture(scope="module")
def pair_result() -> dict:
    """compare() on the committed proxy/target pair (computed once)."""
    return compare(PAIR / "proxy", PAIR / "target")


@pytest.fixture(scope="module")
def sweep_result() -> dict:
    """sweep() on the committed lr sweep, extrapolated to d_model 256 (computed once)."""
    return sweep(SWEEP, target_d_model=256)


def test_compare_names_the_injected_change(pair_result: dict) -> None:
    """The injected change (qk-layernorm dropped) is the top explanation, with the departure step."""
    expected = json.loads((PAIR / "target" / "expected.json").read_text())
    assert [d["setting"] for d in pair_result["differences"]] == list(expected["injected"])
    top = pair_result["explanations"][0]
    assert top["setting"] == expected["top_explanation"] == "qk_layernorm"
    assert top["mechanism"] == "attention_logit_growth"
    dep = pair_result["departure"]
    assert dep is not None and dep["signal"] == "attn_logit_max" and 1 <= dep["step"] <= 30
    assert pair_result["trial"]["setting"] == "qk_layernorm" and pair_result["trial"]["value"] is True
    assert pair_result["trial"]["steps"] >= dep["step"]


def test_compare_json_contract(pair_result: dict) -> None:
    """The compare JSON has the stable keys of DESIGN.md section 7."""
    out = json.loads(render_compare(pair_result, "json"))
    for key in ("schema_version", "proxy", "target", "differences", "departure", "explanations", "trial"):
        assert key in out
    assert {"setting", "proxy", "target", "matters", "why"} <= set(out["differences"][0])
    assert {"step", "signal", "gap"} <= set(out["departure"])
    assert {"setting", "mechanism", "confidence", "for", "against"} <= set(out["explanations"][0])


def test_compare_html_and_markdown(pair_result: dict) -> None:
    """HTML is self-contained with overlay charts of the runs it is given; Markdown names the departure."""
    from forensics.api import load

    assert render_compare(pair_result, "html").count("<svg") == 0  # the renderer reads no run itself
    html = render_compare(pair_result, "html", load(PAIR / "proxy"), load(PAIR / "target"))
    assert html.count("<svg") >= 3 and "departs" in html and "qk_layernorm" in html
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")
    md = render_compare(pair_result, "markdown")
    assert "qk_layernorm" in md and "attn_logit_max at step" in md


def _groups(result: dict) -> dict[tuple[int, bool], dict]:
    return {(g["key"]["d_model"], g["key"]["qk_layernorm"]): g for g in result["groups"]}


def test_sweep_qk_layernorm_flattens_the_lr_curve(sweep_result: dict) -> None:
    """With qk-layernorm: lower LR sensitivity and a largest stable lr at least as high."""
    groups = _groups(sweep_result)
    assert set(groups) == {(32, False), (32, True), (64, False), (64, True)}
    for d in (32, 64):
        off, on = groups[(d, False)], groups[(d, True)]
        assert on["lr_sensitivity"] < off["lr_sensitivity"], d  # Wortsman et al. 2023, s3.1.1, Fig. 1
        assert on["largest_stable_lr"] >= off["largest_stable_lr"], d
        assert len(on["runs"]) == len(off["runs"]) == 5


def test_sweep_attention_logits_grow_without_qk_layernorm(sweep_result: dict) -> None:
    """Without qk-layernorm the attention logits end 10x+ higher at the top lr; trends extrapolate."""
    groups = _groups(sweep_result)
    for d in (32, 64):
        top_off = max(groups[(d, False)]["runs"], key=lambda r: r["lr"])["signatures"]["attn_logit_max_end"]
        top_on = max(groups[(d, True)]["runs"], key=lambda r: r["lr"])["signatures"]["attn_logit_max_end"]
        assert top_off > 10 * top_on
    trends = [t for t in sweep_result["size_trends"] if t["signal"] == "attn_logit_max"]
    assert trends and all(t["predicted"] is not None and t["target_d_model"] == 256 for t in trends)


def test_sweep_json_contract(sweep_result: dict) -> None:
    """The sweep JSON has the stable keys of DESIGN.md section 7; HTML and Markdown render."""
    out = json.loads(render_sweep(sweep_result, "json"))
    assert {"schema_version", "root", "groups"} <= set(out)
    g = out["groups"][0]
    assert {"key", "lr_sensitivity", "largest_stable_lr", "best_lr", "runs"} <= set(g)
    assert {"run", "lr", "final_loss", "diverged", "divergence_step"} <= set(g["runs"][0])
    html = render_sweep(sweep_result, "html")
    assert "<svg" in html and "LR sensitivity" in html and "<script" not in html
    assert "LR sensitivity" in render_sweep(sweep_result, "markdown")


# ------------------------------------------------------------------------------------------ CLI


def test_cli_compare_and_sweep(tmp_path: Path) -> None:
    """``forensics compare`` and ``forensics sweep`` exit 0 and write their reports."""
    runner = CliRunner()
    res = runner.invoke(main, ["compare", str(PAIR / "proxy"), str(PAIR / "target"), "-f", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["explanations"][0]["setting"] == "qk_layernorm"
    out = tmp_path / "sweep.md"
    res = runner.invoke(main, ["sweep", str(SWEEP), "-f", "markdown", "-o", str(out), "--target-params", "1e6"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "LR sensitivity" in text and "Largest stable lr at d_model" in text
    assert "predicted largest stable lr at d_model" in res.stderr


def test_cli_input_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    """A missing or empty input exits 2 with one line naming the path, no traceback."""
    runner = CliRunner()
    missing = tmp_path / "nope"
    res = runner.invoke(main, ["compare", str(missing), str(PAIR / "target"), "-f", "json"])
    assert res.exit_code == 2 and str(missing) in res.stderr and "Traceback" not in res.output
    assert len(res.stderr.strip().splitlines()) == 1
    (tmp_path / "empty" / "a").mkdir(parents=True)
    res = runner.invoke(main, ["sweep", str(tmp_path / "empty"), "-f", "json"])
    assert res.exit_code == 2 and str(tmp_path / "empty") in res.stderr and "Traceback" not in res.output
    res = runner.invoke(main, ["sweep", str(missing)])
    assert res.exit_code == 2 and str(missing) in res.stderr


# ------------------------------------------------------------------------------------------ generated real runs
# Real tiny runs trained on CPU by sample_logs/make_compare_runs.py (several pairs per changed setting, a nested
# sweep 2 widths x 6 lrs x qk-layernorm on/off, a held-out larger width). They are cached outside the repository
# (FORENSICS_GEN20, default /work/gen20 when writable, else a pytest temp folder) and trained only when missing.

GEN_DIR = os.environ.get("FORENSICS_GEN20", "/work/gen20")


def _gen_module():  # noqa: ANN202
    pytest.importorskip("torch", reason="torch (the test extra) trains the generated runs")
    sys.path.insert(0, str(SAMPLES))
    try:
        import make_compare_runs
    finally:
        sys.path.remove(str(SAMPLES))
    return make_compare_runs


@pytest.fixture(scope="session")
def gen(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The generated runs (trained now only where the cache lacks them) and their ground truth."""
    mcr = _gen_module()
    root = Path(GEN_DIR)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError:
        root = tmp_path_factory.mktemp("gen20")
    truth = mcr.make_pairs(root)
    paths = mcr.make_sweep(root)
    return {"root": root, "pairs": truth, "mcr": mcr, **paths}


def _pair_ids() -> list[str]:
    sys.path.insert(0, str(SAMPLES))
    try:
        import make_compare_runs as mcr
    except ImportError:  # torch missing: the fixture skips
        return []
    finally:
        sys.path.remove(str(SAMPLES))
    return [name for _s, name, _p, _t in mcr.pair_specs() + mcr.pair_specs(validation=True)]


@pytest.fixture(scope="session")
def pair_results(gen: dict) -> dict[str, dict]:
    """compare() on every generated pair (computed once)."""
    return {p["pair"]: {**p, "result": compare(p["proxy"], p["target"])} for p in gen["pairs"]}


_TRACE = ("attn_logit_max", "output_logit_max", "log_z", "update_ratio", "grad_norm", "param_norm", "loss",
          "eval_loss")


def _window(proxy: RunData, target: RunData, by_tokens: bool) -> tuple[int, int]:
    """The departure window read straight from the two runs' traces, independently of compare's band.

    lo: the first step where any shared series differs by more than 2% beyond its step-1 ratio (before it, the
    runs are the same run); hi: the first step from which some series stays at 10x or more of the proxy's, and
    10x beyond its step-1 ratio, for 5 points (a loss: 1.5x; log Z: 2.3 nats), or the target's log ends non-finite
    (by then it has surely departed).
    """
    lo, hi = 10**9, 10**9
    for m in _TRACE:
        ps, ts = proxy.series(m), target.series(m)
        if ps is None or ts is None:
            continue
        if by_tokens:
            ptok, ttok = proxy.series("tokens"), target.series("tokens")
            tt = np.interp(ts.steps, ttok.steps, ttok.values)
            pt = np.interp(ps.steps, ptok.steps, ptok.values)
            keep = (tt >= pt[0]) & (tt <= pt[-1])
            steps, pv, tv = ts.steps[keep], np.interp(tt[keep], pt, ps.values), ts.values[keep]
        else:
            steps, pi, ti = np.intersect1d(ps.steps, ts.steps, return_indices=True)
            pv, tv = ps.values[pi], ts.values[ti]
        if m == "log_z":
            g = np.abs((tv - pv) - (tv[0] - pv[0]))
            moved, far = g > 0.02, (g > math.log(10)) & (np.abs(tv - pv) > math.log(10))
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.log(tv / pv) - math.log(tv[0] / pv[0])
            with np.errstate(divide="ignore", invalid="ignore"):
                raw = np.log(tv / pv)
            big = math.log(1.5) if m in ("loss", "eval_loss") else math.log(10)
            moved, far = np.abs(r) > math.log(1.02), (r > big) & (raw > big)
            far = far | (~np.isfinite(tv) & np.isfinite(pv))
        if moved.any():
            lo = min(lo, int(steps[np.flatnonzero(moved)[0]]))
        for i in range(far.size):
            if far[i:i + 5].all() and (i + 5 <= far.size or i == far.size - 1):
                hi = min(hi, int(steps[i]))
                break
    return lo, hi


@pytest.mark.parametrize("pair", _pair_ids())
def test_generated_pair_ranks_the_changed_setting_first(pair: str, pair_results: dict) -> None:
    """Every real pair: the changed setting ranks first; the departure, with its gap, lies in the traces' window."""
    from forensics.api import load

    p = pair_results[pair]
    r = p["result"]
    assert r["explanations"][0]["setting"] == p["setting"], [(e["setting"], e["confidence"]) for e in r["explanations"]]
    dep = r["departure"]
    assert dep is not None and dep["gap"] > 0 and dep["signal"]
    lo, hi = _window(load(p["proxy"]), load(p["target"]), r["alignment"] == "tokens")
    assert lo <= dep["step"] <= hi, (dep, lo, hi)
    if p["setting"] == "global_batch_size":
        assert r["alignment"] == "tokens" and "tokens" in dep
    if p["setting"] in ("warmup_steps", "peak_lr"):
        ev = r["lr_evidence"]
        assert ev is not None and ev["decides"] == p["setting"], ev
        assert any(ev["why"] in x for x in r["explanations"][0]["for"])
        assert r["explanations"][0]["decided_by"]
    if p["setting"] == "warmup_steps":  # inside the (proxy's) warm-up, where the steeper ramp acts
        assert r["lr_evidence"]["inside_warmup"]


def test_growth_departure_before_the_losses_part(pair_results: dict) -> None:
    """qk-layernorm dropped: attention logits depart within the first tens of steps, long before any loss does."""
    for name, p in pair_results.items():
        if p["setting"] != "qk_layernorm":
            continue
        r = p["result"]
        assert r["departure"]["signal"] == "attn_logit_max", name
        loss = r["departures"].get("loss")
        assert loss is None or loss["step"] > 3 * r["departure"]["step"], (name, loss)
        assert r["departure"]["ratio"] > 1.1


def _strip_configs(src: Path, dst: Path) -> None:
    """Copy a JSONL run without its config (only the metrics a job logged)."""
    dst.mkdir(parents=True)
    shutil.copy(src / "metrics.jsonl", dst / "metrics.jsonl")


@pytest.mark.parametrize("setting", ["qk_layernorm", "z_loss", "warmup_steps", "peak_lr", "global_batch_size"])
def test_generated_pair_without_configs_ranks_from_the_logs(setting: str, gen: dict, tmp_path: Path) -> None:
    """No configuration at all: the lr trace (peak lr, warm-up), the tokens (batch) or the departing series decide."""
    p = next(x for x in gen["pairs"] if x["setting"] == setting and (Path(x["proxy"]) / "metrics.jsonl").is_file())
    _strip_configs(Path(p["proxy"]), tmp_path / "proxy")
    _strip_configs(Path(p["target"]), tmp_path / "target")
    r = compare(tmp_path / "proxy", tmp_path / "target")
    assert r["explanations"][0]["setting"] == setting, [(e["setting"], e["confidence"]) for e in r["explanations"]]
    if setting in ("warmup_steps", "peak_lr", "global_batch_size"):
        assert any(d["setting"] == setting and d["source"] == "logs" for d in r["differences"])
    else:
        assert r["explanations"][0].get("inferred") and r["explanations"][0]["against"]


def test_mup_check_on_a_real_mup_pair(gen: dict) -> None:
    """Both runs claim muP: width multipliers, per-group lrs and output multiplier verified from config and logs."""
    r = compare(gen["root"] / "mup_pair" / "proxy", gen["root"] / "mup_pair" / "target")
    mc = r["mup_check"]
    assert mc is not None and mc["claimed"]
    status = {c["what"]: c["status"] for c in mc["checks"]}
    assert status["width multipliers"] == status["per-group lrs"] == status["output multiplier"] == "ok"
    assert mc["also_not_verifiable"]
    assert not any(d["setting"] == "d_model" and d["matters"] for d in r["differences"])  # width transfers under muP


def test_mup_check_reports_mismatches_and_what_it_cannot_verify() -> None:
    """A target whose hidden lr was not scaled is a mismatch; a missing output multiplier is not verifiable."""
    from forensics.config_diff import mup_check

    pf = {"mup": True, "mup_base_width": 256, "param_groups": [{"name": "hidden", "lr": 1e-2}]}
    tf = {"mup": True, "mup_base_width": 256, "param_groups": [{"name": "hidden", "lr": 1e-2}]}
    mc = mup_check(pf, tf, {"d_model": 256, "peak_lr": 1e-2}, {"d_model": 1024, "peak_lr": 1e-2})
    status = {c["what"]: c["status"] for c in mc["checks"]}
    assert status["width multipliers"] == "ok" and status["per-group lrs"] == "mismatch"
    assert "output multiplier" in mc["not_verifiable"] and mc["verdict"].startswith("muP claim contradicted")
    assert mup_check({"mup": True}, {"lr": 1e-3}, {}, {}) is None  # only one run claims muP


# ------------------------------------------------------------------------------------------ nested sweep, layout


@pytest.fixture(scope="session")
def nested_sweep(gen: dict) -> dict:
    """sweep() over the nested root (width_<d>/qkln_<x>/lr_<lr>, each sweep folder with its own sweep.yaml)."""
    return sweep(gen["sweep"], target_width=gen["mcr"].HELD_OUT_WIDTH)


def test_layout_finds_nested_runs_for_sweep_and_audit(gen: dict) -> None:
    """The layout module and the audit find the 24 runs of the nested root, not its four sweep folders."""
    from forensics.audit import find_runs as audit_find_runs
    from forensics.layout import find_runs

    runs = find_runs(gen["sweep"])
    assert len(runs) == 24 and all(r.parent.parent.parent == gen["sweep"] for r in runs)
    assert [Path(p) for p in audit_find_runs(gen["sweep"])] == runs


def test_layout_wandb_attempts_belong_to_their_run(gen: dict, tmp_path: Path) -> None:
    """Two attempts of one W&B run id in a run's wandb/ folder are one run; two ids are two runs."""
    from forensics.layout import find_runs

    src = next(Path(p["proxy"]) for p in gen["pairs"] if (Path(p["proxy"]) / "wandb").is_dir())
    one = next((src / "wandb").glob("offline-run-*"))
    rid = one.name.rsplit("-", 1)[1]
    for stamp in ("20260101_000000", "20260101_010000"):
        shutil.copytree(one, tmp_path / "exp" / "run_a" / "wandb" / f"offline-run-{stamp}-{rid}")
    shutil.copytree(one, tmp_path / "exp" / "run_b" / "wandb" / f"offline-run-20260101_000000-{rid}")
    assert find_runs(tmp_path / "exp") == [tmp_path / "exp" / "run_a", tmp_path / "exp" / "run_b"]
    shutil.copytree(one, tmp_path / "two" / "wandb" / "offline-run-20260101_000000-aaaa1111")
    shutil.copytree(one, tmp_path / "two" / "wandb" / "offline-run-20260101_000000-bbbb2222")
    assert [r.name for r in find_runs(tmp_path / "two")] == ["offline-run-20260101_000000-aaaa1111",
                                                             "offline-run-20260101_000000-bbbb2222"]


def test_layout_two_sweeps_with_their_own_files(tmp_path: Path) -> None:
    """A root holding two sweep folders, each with a file of its own and runs whose configs differ: every run."""
    from forensics.layout import find_runs

    for sw in ("sweep_a", "sweep_b"):
        (tmp_path / sw).mkdir()
        (tmp_path / sw / "sweep.yaml").write_text("method: grid\n")
        for lr in (1e-3, 1e-2):
            run = tmp_path / sw / f"trial_{lr:g}"
            run.mkdir()
            (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
            (run / "config.json").write_text(json.dumps({"lr": lr}))
    assert len(find_runs(tmp_path)) == 4
    # attempts of one job whose configs differ only in the resume horizon stay one run
    job = tmp_path / "job"
    for i, steps in enumerate((100, 200)):
        (job / f"attempt_{i}").mkdir(parents=True)
        (job / f"attempt_{i}" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
        (job / f"attempt_{i}" / "config.json").write_text(json.dumps({"lr": 1e-3, "max_steps": steps}))
    (job / "launch.sh").write_text("python train.py\n")
    assert find_runs(job) == [job]
    # role folders of one run (train/ and eval/) carry different configs by design: still one run
    exp = tmp_path / "roles" / "exp"
    for role in ("train", "eval"):
        (exp / role).mkdir(parents=True)
        (exp / role / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
        (exp / role / "config.json").write_text(json.dumps({"mode": role, "batch_size": 8 if role == "train" else 64}))
    assert find_runs(tmp_path / "roles") == [exp]


def test_nested_sweep_grouped_by_width_and_qk_layernorm(nested_sweep: dict) -> None:
    """Groups by every varying setting read from configs, nested as the folders nest them, 6 lrs each."""
    assert nested_sweep["nesting"] == ["d_model", "qk_layernorm"]
    groups = _groups(nested_sweep)
    assert set(groups) == {(16, False), (16, True), (32, False), (32, True)}
    assert all(len(g["runs"]) == 6 and len(g["lrs"]) == 6 for g in groups.values())
    assert [n["value"] for n in nested_sweep["tree"]] == [16, 32]
    assert all(g["runs"][0]["final_loss_source"].startswith("eval_loss") for g in groups.values())


def test_nested_sweep_qk_layernorm_lowers_lr_sensitivity_at_both_widths(nested_sweep: dict) -> None:
    """Wortsman et al. 2023 s3.1.1: qk-layernorm lowers LR sensitivity, here at width 16 and at width 32."""
    groups = _groups(nested_sweep)
    for d in (16, 32):
        assert groups[(d, True)]["lr_sensitivity"] < groups[(d, False)]["lr_sensitivity"], d
        assert groups[(d, True)]["largest_stable_lr"] >= groups[(d, False)]["largest_stable_lr"], d


def test_size_trend_predicts_the_held_out_width(nested_sweep: dict, gen: dict) -> None:
    """Predicted largest stable lr at the held-out larger width is within one lr grid step of the measured one."""
    held = sweep(gen["held_out"])
    assert len(held["groups"]) == 1
    measured = held["groups"][0]["largest_stable_lr"]
    pred = next(p for p in nested_sweep["size_predictions"] if p["key"] == {"qk_layernorm": False})
    grid = pred["grid"]
    assert pred["target_size"] == gen["mcr"].HELD_OUT_WIDTH and pred["too_few_sizes"]
    assert any("no error estimate" in n for n in pred["notes"])
    assert pred["predicted_largest_stable_lr"] is not None and pred["interval"]
    assert abs(grid.index(pred["predicted_largest_stable_lr"]) - grid.index(measured)) <= 1, (pred, measured)
    trends = {(t["lr"], t["signal"]) for t in nested_sweep["size_trends"] if t["key"] == {"qk_layernorm": False}}
    assert {(lr, s) for lr in grid for s in ("attn_logit_max", "output_logit_max", "update_ratio")} <= trends


def test_target_params_converts_to_a_width() -> None:
    """--target-params: N = 12 L d^2 + 2 V d solved for d (and for L at a fixed width)."""
    from forensics.sweep import params_to_size

    d = params_to_size(12 * 2 * 64**2 + 2 * 256 * 64, "d_model", {"n_layers": 2}, 256)
    assert d == pytest.approx(64)
    assert params_to_size(12 * 8 * 64**2, "n_layers", {"d_model": 64}, None) == pytest.approx(8)


def test_settings_from_folder_names() -> None:
    """Folder names are a fallback: width_32/qkln_off/lr_3e-02 and d64_qkln-on_lr1e-01."""
    from forensics.sweep import settings_from_name

    assert settings_from_name("width_32/qkln_off/lr_3e-02") == {"d_model": 32, "qk_layernorm": False,
                                                                 "peak_lr": 0.03}
    assert settings_from_name("d64_qkln-on_lr1e-01") == {"d_model": 64, "qk_layernorm": True, "peak_lr": 0.1}


def test_seed_only_pairs_do_not_depart(gen: dict) -> None:
    """Runs that differ only in their seed (init and data order): no series departs, no setting is blamed."""
    for pair in sorted((gen["root"] / "null_pairs").iterdir()):
        r = compare(pair / "proxy", pair / "target")
        assert r["departure"] is None, (pair.name, r["departure"])
        assert r["differences"] == [] and not any(e.get("inferred") for e in r["explanations"])


def test_departure_of_a_target_that_dies() -> None:
    """A target whose last logged point is non-finite (an fp32 job aborts there) departs at that point."""
    steps = np.arange(1, 61)
    proxy = np.full(60, 10.0) * np.exp(np.random.default_rng(1).normal(0, 0.01, 60))
    target = proxy.copy()
    target[-1] = np.nan
    dep = departure_of(steps, proxy, target)
    assert dep is not None and dep["step"] == 60 and dep["delta"] == float("inf")


def test_runs_logged_at_different_steps_are_interpolated(pair_results: dict, tmp_path: Path) -> None:
    """The proxy logged every 10th step, offset by 5 from the target's: still aligned, same departing series."""
    p = pair_results["qk_layernorm_0"]
    lines = (Path(p["proxy"]) / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "metrics.jsonl").write_text(
        "\n".join(x for x in lines if json.loads(x)["step"] % 10 == 5) + "\n")
    shutil.copy(Path(p["proxy"]) / "config.json", tmp_path / "proxy" / "config.json")
    r = compare(tmp_path / "proxy", p["target"])
    assert r["departure"] is not None and r["departure"]["signal"] == "attn_logit_max"
    assert r["departure"]["step"] <= 2 * p["result"]["departure"]["step"] + 10


def test_sweep_without_configs_groups_by_folder_names(gen: dict, tmp_path: Path) -> None:
    """Real runs stripped of their configs: settings and lrs read from the nested folder names (the fallback)."""
    for qk in ("off", "on"):
        for lr in ("lr_1e-02", "lr_1e-01"):
            rel = Path("width_16") / f"qkln_{qk}" / lr
            (tmp_path / rel).mkdir(parents=True)
            shutil.copy(gen["sweep"] / rel / "metrics.jsonl", tmp_path / rel / "metrics.jsonl")
    r = sweep(tmp_path)
    assert r["nesting"] == ["qk_layernorm"] and any("folder names" in n for n in r["notes"])
    assert {g["key"]["qk_layernorm"]: g["lrs"] for g in r["groups"]} == {False: [0.01, 0.1], True: [0.01, 0.1]}
