"""compare (proxy vs target) and sweep (LR sensitivity): units on hand-made numbers, then the real samples.

Samples: ``sample_logs/proxy_target/{proxy,target}`` (qk-layernorm dropped in the target, the one injected
change) and ``sample_logs/sweep/`` (peak lr x qk-layernorm x d_model), made by
``sample_logs/make_sweep_samples.py``.
"""

from __future__ import annotations

import json
import math
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
    """A sustained rise departs near its start; a lower target or two noisy points do not."""
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
    assert departure_of(steps, proxy, proxy * 0.1, two_sided=True)["step"] == 1  # type: ignore[index]


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
    assert set(out["differences"][0]) == {"setting", "proxy", "target", "matters", "why"}
    assert set(out["departure"]) == {"step", "signal"}
    assert {"setting", "mechanism", "confidence", "for", "against"} <= set(out["explanations"][0])


def test_compare_html_and_markdown(pair_result: dict) -> None:
    """HTML is self-contained with overlay charts; Markdown names the departure."""
    html = render_compare(pair_result, "html")
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
    res = runner.invoke(main, ["sweep", str(SWEEP), "-f", "markdown", "-o", str(out), "--target-d-model", "128"])
    assert res.exit_code == 0, res.output
    assert "LR sensitivity" in out.read_text()


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
