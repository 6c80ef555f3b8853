"""Tests of the renderers in ``reports/`` (HTML, JSON, Markdown, text) on hand-built analyses."""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
import time

import jsonschema
import numpy as np
import polars as pl
import pytest

import forensics
from forensics.model import (
    CAUSES,
    SEVERITIES,
    Analysis,
    Finding,
    Hypothesis,
    RecoveryPlan,
    RunData,
    Skip,
    SourceInfo,
    Trial,
)
from forensics.schema import EVENTS_SCHEMA, METRICS_SCHEMA, empty_events
from reports import ReportFormat, render
from reports.charts import BUCKETS, display_indices, minmax_indices
from reports.html_report import chart_plan, render_html
from reports.json_report import load_schema, render_json, to_dict
from reports.markdown_report import MAX_LINES, render_markdown
from reports.text_report import render_text

# ----------------------------------------------------------------------------------- builders


def metrics_frame(columns: dict[str, np.ndarray], steps: np.ndarray, segments: np.ndarray,
                  run: str = "run") -> pl.DataFrame:
    """A long metrics table (METRICS_SCHEMA layout) from wide numpy columns."""
    parts = []
    n = steps.shape[0]
    for name, values in columns.items():
        parts.append(pl.DataFrame({
            "run": pl.Series([run] * n, dtype=pl.String) if n < 10_000 else pl.repeat(run, n, eager=True),
            "segment": pl.Series(segments, dtype=pl.Int32),
            "step": pl.Series(steps, dtype=pl.Int64),
            "metric": pl.repeat(name, n, eager=True),
            "value": pl.Series(values, dtype=pl.Float64, nan_to_null=False),
            "wall_time": pl.Series([None] * n, dtype=pl.Float64) if n < 10_000
            else pl.repeat(None, n, dtype=pl.Float64, eager=True),
            "tag": pl.repeat(f"train/{name}", n, eager=True),
            "source": pl.repeat("metrics.jsonl", n, eager=True),
        }))
    df = pl.concat(parts)
    assert [(f.name) for f in METRICS_SCHEMA] == df.columns
    return df


def make_run(n: int = 500, *, restart: int = 300, layers: int = 0, name: str = "runs/toy") -> RunData:
    """500 steps of loss/lr/grad_norm in two segments (restart at step 300), NaN at the end."""
    steps = np.arange(n, dtype=np.int64)
    segments = (steps >= restart).astype(np.int32)
    rng = np.random.default_rng(0)
    loss = 5.0 * np.exp(-steps / (n / 3)) + 1.5 + 0.05 * rng.standard_normal(n)
    grad = 1.0 + 0.1 * rng.standard_normal(n)
    onset = int(n * 0.9)
    grad[onset:] *= np.exp(np.arange(n - onset) / 4.0)
    loss[onset + 3:] += np.exp(np.arange(n - onset - 3) / 5.0) - 1
    loss[-1] = math.nan
    grad[-1] = math.inf
    lr = np.minimum(1.0, (steps + 1) / 50.0) * 3e-4
    cols = {"loss": loss, "lr": lr, "grad_norm": grad}
    for i in range(layers):
        cols[f"attn_logit_max/layer{i}"] = 10 + i + 0.05 * steps * (1 + (steps >= onset) * 3)
    metrics = metrics_frame(cols, steps, segments, run=name)
    events = pl.from_arrow(empty_events())
    assert isinstance(events, pl.DataFrame) and events.schema.names() == EVENTS_SCHEMA.names
    return RunData(
        run=name, metrics=metrics, events=events,
        meta={"lr": 3e-4, "optimizer": {"name": "adamw", "betas": [0.9, 0.95]}},
        sources=[SourceInfo("metrics.jsonl", "jsonl", n, 2)], skipped=[],
    )


def healthy(run: str = "runs/healthy") -> Analysis:
    """A healthy analysis: no cause, no onset, no recovery."""
    return Analysis(
        run=run, verdict="healthy", cause=None, mechanism=None, confidence=0.9, onset=None,
        hypotheses=(), findings=(), recovery=None,
        sources=(SourceInfo("metrics.jsonl", "jsonl", 500, 1),),
        skipped=(Skip("OV02", "metric loss_scale not logged"),),
        summary="Nothing anomalous.", meta={"lr": 3e-4},
    )


def anomaly(run: str = "runs/toy") -> Analysis:
    """An anomaly with findings (non-finite evidence), hypotheses and a recovery plan."""
    f1 = Finding(
        code="UG01", name="update.grad_norm_growth", cause="update_scale_growth", mechanism="lr_too_high",
        step=450, segment=1, confidence=0.82, severity="high",
        message="grad_norm grew 40x over 45 steps before the loss diverged.",
        evidence={"metric": "grad_norm", "growth": 40.2, "window": [405, 450], "last": math.inf,
                  "z": np.float64(9.1), "steps": np.array([450, 451])},
        against=("lr continuous across the resume",),
    )
    f2 = Finding(
        code="NF01", name="nonfinite.loss", cause="overflow", mechanism="activation_overflow",
        step=499, segment=1, confidence=0.4, severity="critical",
        message="loss is NaN at step 499 | first non-finite value.",
        evidence={"metric": "loss", "value": math.nan, "neg": -math.inf},
    )
    f3 = Finding(
        code="LR02", name="lr.resume_check", cause=None, mechanism=None, step=300, segment=1,
        confidence=0.1, severity="info", message="lr is continuous across the resume at step 300.",
    )
    plan = RecoveryPlan(
        resume_from={"checkpoint": "ckpt/step_400", "step": 400,
                     "why": "newest finite checkpoint before onset"},
        restore=("optimizer moments", "scheduler state (expected lr 3e-4)"),
        trials=(
            Trial("lr x0.5", "peak lr x0.5 with 50-step re-warm-up", 150,
                  {"peak_lr_factor": 0.5, "warmup_steps": 50, "clip_grad_norm": 1.0}),
            Trial("lr x0.25", "peak lr x0.25 with 50-step re-warm-up", 150,
                  {"peak_lr_factor": 0.25, "warmup_steps": 50, "clip_grad_norm": 1.0}),
        ),
        success_criteria=("no loss spike beyond 6 robust sigmas", "grad_norm within [0.8, 1.3]"),
        do_not=("do not resume from ckpt/step_480: non-finite exp_avg_sq",),
    )
    return Analysis(
        run=run, verdict="anomaly", cause="update_scale_growth", mechanism="lr_too_high", confidence=0.78,
        onset={"step": 450, "segment": 1},
        hypotheses=(
            Hypothesis("update_scale_growth", "lr_too_high", 0.78, ("grad_norm leads loss by 3 steps",),
                       ("no Q/K checkpoint evidence",)),
            Hypothesis("overflow", "activation_overflow", 0.2, ("NaN loss at 499",),
                       ("growth precedes NaN",)),
        ),
        findings=(f1, f2, f3), recovery=plan,
        sources=(SourceInfo("metrics.jsonl", "jsonl", 500, 2),
                 SourceInfo("https://example.org/x", "csv", 3, 1)),
        skipped=(Skip("checkpoints/", "no checkpoints found"), Skip("OV02", "metric loss_scale not logged")),
        summary="grad_norm grew for 45 steps before the loss diverged at step 453.",
        meta={"lr": 3e-4, "optimizer": {"name": "adamw", "betas": [0.9, 0.95], "eps": 1e-8},
              "warmup": math.nan},
    )


def transient(run: str = "runs/transient") -> Analysis:
    """A transient: an isolated spike that recovered; monitor, no roll-back trials."""
    f = Finding(
        code="DB01", name="data.isolated_spike", cause="data_batch", mechanism="bad_batch",
        step=200, segment=0,
        confidence=0.6, severity="medium", message="Isolated loss spike at step 200 with no precursor.",
        evidence={"metric": "loss", "batch_index": 1234, "robust_z": 14.2},
    )
    return Analysis(
        run=run, verdict="transient", cause="data_batch", mechanism="bad_batch", confidence=0.6,
        onset={"step": 200, "segment": 0},
        hypotheses=(Hypothesis("data_batch", "bad_batch", 0.6, ("no precursor",)),),
        findings=(f,), recovery=None, sources=(), skipped=(), summary="Recovered by itself; monitor.",
    )


ANALYSES = {"healthy": healthy, "anomaly": anomaly, "transient": transient}

# ----------------------------------------------------------------------------------- dispatch


@pytest.fixture(scope="module")
def run() -> RunData:
    """The 500-step, two-segment run."""
    return make_run(layers=4)


@pytest.mark.parametrize("fmt", list(ReportFormat))
@pytest.mark.parametrize("kind", list(ANALYSES))
def test_every_format_renders(fmt: ReportFormat, kind: str, run: RunData) -> None:
    """STYLE item 8: every member of the enum renders every verdict."""
    out = render(ANALYSES[kind](), run, fmt, html_path="/tmp/r.html")
    assert isinstance(out, str) and out.strip()


def test_format_values_and_strings(run: RunData) -> None:
    """The enum values are the CLI's -f choices; a plain string works as well."""
    assert [f.value for f in ReportFormat] == ["html", "json", "markdown", "text"]
    assert json.loads(render(anomaly(), None, "json"))["verdict"] == "anomaly"
    with pytest.raises(ValueError):
        render(anomaly(), run, "pdf")


def test_render_without_run_has_no_charts() -> None:
    """run=None renders, with the charts section saying why it is empty (and no BokehJS in the page)."""
    html = render(anomaly(), None, ReportFormat.html)
    assert 'id="charts"' in html and 'class="tf-plot"' not in html and len(html.encode()) < 200_000
    assert "charts need the run's metrics" in html


# ----------------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("kind", list(ANALYSES))
def test_json_validates_against_schema(kind: str) -> None:
    """Strict JSON (no NaN tokens) that validates against the published schema."""
    text = render_json(ANALYSES[kind]())
    obj = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(obj)
    assert obj["schema_version"] == forensics.SCHEMA_VERSION


def test_json_contract_keys_and_values() -> None:
    """Section 7 keys, onset shape, non-finite evidence kept as strings, numpy converted."""
    obj = to_dict(anomaly())
    for key in ("schema_version", "run", "verdict", "cause", "mechanism", "confidence", "onset", "hypotheses",
                "findings", "recovery", "sources", "skipped"):
        assert key in obj
    assert obj["onset"] == {"step": 450, "segment": 1}
    assert set(obj["hypotheses"][0]) >= {"cause", "mechanism", "confidence", "for", "against"}
    ev = obj["findings"][0]["evidence"]
    assert ev["last"] == "Infinity" and ev["z"] == 9.1 and ev["steps"] == [450, 451]
    assert obj["findings"][1]["evidence"] == {"metric": "loss", "value": "NaN", "neg": "-Infinity"}
    assert obj["meta"]["warmup"] == "NaN"
    assert obj["recovery"]["resume_from"]["step"] == 400
    assert obj["sources"][0] == {"path": "metrics.jsonl", "format": "jsonl", "records": 500, "segments": 2}
    assert obj["skipped"][0] == {"what": "checkpoints/", "reason": "no checkpoints found"}
    h = to_dict(healthy())
    assert h["cause"] is None and h["onset"] is None and h["recovery"] is None


def test_schema_enums_follow_the_model() -> None:
    """The schema's cause and severity enums are exactly forensics.model's."""
    schema = load_schema()
    assert schema["properties"]["cause"]["enum"] == [*CAUSES, None]
    assert schema["$defs"]["hypothesis"]["properties"]["cause"]["enum"] == list(CAUSES)
    assert schema["$defs"]["finding"]["properties"]["severity"]["enum"] == list(SEVERITIES)
    assert schema["properties"]["schema_version"]["const"] == forensics.SCHEMA_VERSION


def test_schema_rejects_bad_objects() -> None:
    """Unknown verdicts and causes, a cause on a healthy run, a bad onset: all rejected."""
    validator = jsonschema.Draft202012Validator(load_schema())
    good = to_dict(anomaly())
    assert validator.is_valid(good)
    for patch in ({"verdict": "broken"}, {"cause": "gremlins"}, {"onset": {"step": "x", "segment": 0}},
                  {"confidence": 1.5}, {"verdict": "healthy"}):
        assert not validator.is_valid({**good, **patch}), patch
    missing = dict(good)
    del missing["skipped"]
    assert not validator.is_valid(missing)


# ----------------------------------------------------------------------------------- HTML

SECTION_IDS = (
    "verdict", "onset", "charts", "evidence", "hypotheses", "recovery", "sources", "skipped", "config", "glossary",
)
_EXTERNAL = re.compile(r"""\b(?:src|href|xlink:href|action|poster)\s*=\s*["']?\s*(?:https?:)?//""", re.I)
_URL_IN_JS = re.compile(
    r"""\b(?:src|href)\s*[=:]\s*[`"']https?://|fetch\(\s*[`"']https?://|url\(\s*['"]?https?:""", re.I)


@pytest.mark.parametrize("kind", list(ANALYSES))
def test_html_sections_and_self_contained(kind: str, run: RunData) -> None:
    """Every section id, inline SVG charts, no external resource loads."""
    html = render_html(ANALYSES[kind](), run)
    for sid in SECTION_IDS:
        assert f'id="{sid}"' in html, sid
    assert html.count('class="tf-plot"') >= 3, "chart panels missing"
    assert not _EXTERNAL.search(html), _EXTERNAL.search(html)
    scripts = "".join(re.findall(r"<script[^>]*>(.*?)</script>", html, flags=re.S))
    hits = {m.group(0) for m in _URL_IN_JS.finditer(scripts)}
    # dormant BokehJS paths the report never triggers (Google Maps tiles, the Bokeh logo link, icon fonts)
    assert hits <= {'href:"https://', 'src=`https://'}, hits
    assert not re.search(r"@import|url\(\s*['\"]?https?:", html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html  # the page refuses any fetch
    assert html.count('<section id="') == len(SECTION_IDS)
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "duplicate element ids"


def test_html_resume_without_a_checkpoint_names_a_step_to_look_for(run: RunData) -> None:
    """No checkpoint in the folder: the first step says which checkpoint to look for, not "start again, step N"."""
    from dataclasses import replace

    a = anomaly()
    a = replace(a, recovery=replace(a.recovery, resume_from={"checkpoint": None, "step": 46,
                                                            "why": "no checkpoint found in the folder"}))
    html = render_html(a, run)
    assert "start again" not in html
    assert "your newest checkpoint at or before step <strong>46</strong>" in html
    assert "Why this step: no checkpoint found" in html


def test_html_content(run: RunData) -> None:
    """Verdict banner, onset, evidence, trials, do-not, sources, skips and config all appear."""
    html = render_html(anomaly(), run)
    assert 'class="banner anomaly"' in html
    assert "step <strong>450</strong>" in html or "step 450" in html
    for text in ("UG01", "update.grad_norm_growth", "lr x0.25", "ckpt/step_400", "non-finite exp_avg_sq",
                 "no checkpoints found", "optimizer.name", "adamw", "no Q/K checkpoint evidence"):
        assert text in html, text
    for cid in ("chart-loss", "chart-lr", "chart-grad_norm", "zoom-loss", "zoom-grad_norm",
                "layers-attn_logit_max"):
        assert f'id="{cid}"' in html, cid
    assert 'class="banner healthy"' in render_html(healthy(), run)
    assert 'class="banner transient"' in render_html(transient(), run)


def _chart_data(html: str) -> dict:
    """The chart data the page's script draws (``<script type="application/json" id="tf-charts">``)."""
    found = re.search(r'<script type="application/json" id="tf-charts">(.*?)</script>', html, flags=re.S)
    assert found, "no chart data in the page"
    return json.loads(found.group(1), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


@pytest.mark.parametrize("kind", list(ANALYSES))
def test_html_chart_data_is_whole(kind: str, run: RunData) -> None:
    """Every panel has its placeholder and its data: series of one length, markers, x ranges, the onset.

    What BokehJS draws from it is checked in a real browser (``tests/test_browser.py``).
    """
    def size(text: str) -> int:
        return len(gzip.decompress(base64.b64decode(text)))

    html = render_html(ANALYSES[kind](), run)
    spec = _chart_data(html)
    figures = re.findall(r'<figure class="chart" id="([^"]+)"', html)
    assert [p["id"] for p in spec["panels"]] and sorted(p["id"] for p in spec["panels"]) == sorted(figures)
    for p in spec["panels"]:
        assert f'<div class="tf-plot" id="{p["id"]}-plot"></div>' in html
        assert p["x"] in spec["x"] and p["height"] > 0
        if p["kind"] == "heat":
            assert size(p["image"]) == 4 * p["rows"] * p["cols"]
            continue
        src = spec["sources"][p["metric"]]
        n = size(src["x"]) // 8
        assert n > 0 and size(src["y"]) == 8 * n and size(src["ys"]) == 4 * n  # a panel's series: smoothed too
        assert set(src["marks"]) == {"x", "y", "kind", "marker"}
        assert p["logRange"][0] < p["logRange"][1]
    onset = ANALYSES[kind]().onset
    assert spec["onset"] == (onset["step"] if onset else None)
    assert set(spec["overlay"]) <= set(spec["sources"])
    drawn = {p["metric"] for p in spec["panels"]}
    assert all("ys" not in src for m, src in spec["sources"].items() if m not in drawn)  # overlay only: no smoothing
    for lo, hi in spec["x"].values():
        assert lo <= hi


def test_html_autoescape(run: RunData) -> None:
    """A hostile run name or message is escaped, never executed."""
    bad = anomaly(run="<script>alert(1)</script>")
    html = render_html(bad, run)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    md = render_markdown(bad)
    assert "alert(1)" in md  # markdown is plain text: not escaped, but kept inside code spans


def test_chart_plan_includes_referenced_metrics() -> None:
    """A metric the findings reference is charted even when it is not a default."""
    r = make_run(n=200, restart=150)
    extra = metrics_frame({"param_norm": np.linspace(1, 2, 200)}, np.arange(200), np.zeros(200, np.int32))
    r = RunData(r.run, pl.concat([r.metrics, extra]), r.events, r.meta, r.sources, r.skipped)
    a = anomaly()
    f = Finding("PN01", "param.norm_drift", "update_scale_growth", None, 100, 0, 0.5, "low", "drift",
                {"metric": "param_norm"})
    a2 = Analysis(**{**a.__dict__, "findings": (*a.findings, f)})
    main, zoom, layers = chart_plan(a2, r)
    assert main[:3] == ["loss", "lr", "grad_norm"] and "param_norm" in main
    assert zoom == ["loss", "grad_norm"] and layers == {}
    main_h, zoom_h, _ = chart_plan(healthy(), r)
    assert "param_norm" not in main_h and zoom_h == []


def test_only_per_layer_groups_become_heat_maps() -> None:
    """``base/<layer or module>`` series make a heat map; loss parts and unit-like names (detectron2, fairseq) do not.

    A referenced part (``loss/loss_box_reg``) gets a line chart instead.
    """
    from reports.html_report import per_layer

    assert per_layer(["attn_logit_max/layer0", "attn_logit_max/layer1"])
    assert per_layer([f"grad_norm/layers.{i}.mlp" for i in range(4)])
    assert per_layer(["absmax/enc.wo", "absmax/dec.wo"])
    assert not per_layer(["loss/loss_box_reg", "loss/loss_cls", "loss/loss_mask", "loss/loss_rpn_cls"])
    assert not per_layer(["throughput/tokens_per_second", "throughput/samples_per_second"])
    assert not per_layer(["attn_logit_max/layer0"])  # one row is no map
    names = {"loss/loss_box_reg": 1.0, "loss/loss_cls": 2.0, "grad_norm/layer0": 1.0, "grad_norm/layer1": 1.0}
    r = make_run(n=200)
    extra = pl.concat([metrics_frame({k: np.full(200, v)}, np.arange(200), np.zeros(200, np.int32))
                       for k, v in names.items()])
    r = RunData(r.run, pl.concat([r.metrics, extra]), r.events, r.meta, r.sources, r.skipped)
    a = anomaly()
    f = Finding("SP01", "loss.spike", None, None, 100, 0, 0.5, "low", "spike", {"metric": "loss/loss_box_reg"})
    main, _, layers = chart_plan(Analysis(**{**a.__dict__, "findings": (*a.findings, f)}), r)
    assert list(layers) == ["grad_norm"] and "loss/loss_box_reg" in main


def test_downsampling_keeps_extremes_and_onset_window() -> None:
    """Min/max per bucket survive; the onset window keeps every point."""
    n = 100_000
    steps = np.arange(n, dtype=np.int64)
    values = np.sin(steps / 1000.0)
    values[12_345] = 50.0
    values[67_890] = -50.0
    values[80_000] = math.nan
    idx = minmax_indices(values)
    assert idx.size <= 2 * BUCKETS + 2 + BUCKETS
    assert {12_345, 67_890, 80_000, 0, n - 1} <= set(idx.tolist())
    idx2 = display_indices(steps, values, (50_000, 50_200), 50_100)
    assert set(range(50_000, 50_201)) <= set(idx2.tolist())
    assert np.array_equal(minmax_indices(values[:100]), np.arange(100))


@pytest.mark.parametrize("n", [4001, 100_000, 200_000, 200_001, 1_000_003])
def test_minmax_of_a_finite_series_equals_the_padded_buckets(n: int) -> None:
    """The all-finite path (full buckets as a view) keeps exactly the indices of the padded one; ties too."""
    from reports.downsample import _minmax_padded

    rng = np.random.default_rng(n)
    for values in (rng.standard_normal(n), np.round(rng.standard_normal(n), 1), np.ones(n)):
        size = -(-n // BUCKETS)
        assert np.array_equal(minmax_indices(values), _minmax_padded(values, np.isfinite(values), size))


# ----------------------------------------------------------------------------------- Markdown and text


@pytest.mark.parametrize("kind", list(ANALYSES))
def test_markdown_is_short(kind: str) -> None:
    """Under 60 lines, with the verdict, onset and where the HTML report is."""
    md = render_markdown(ANALYSES[kind](), html_path="reports/run.html")
    assert len(md.splitlines()) < MAX_LINES
    assert f"**Verdict: {kind.upper()}**" in md
    assert "reports/run.html" in md


def test_markdown_content_and_caps() -> None:
    """What to do first (resume, first trial, proof), other arms, do-not; long lists capped under 60 lines."""
    a = anomaly()
    md = render_markdown(a)
    assert "**Resume from** `ckpt/step_400` at step 400: newest finite checkpoint before onset" in md
    assert "**First trial: lr x0.5** (150 steps)" in md and "**lr x0.25** (150 steps)" in md
    assert md.index("## What to do") < md.index("## Evidence")
    assert "**Do not:**" in md and "It worked if" in md
    many = tuple(
        Finding(f"X{i:02d}", f"x.f{i}", "unknown", None, i, 0, 0.5, "low", f"finding {i}\nsecond line")
        for i in range(40)
    )
    plan = RecoveryPlan({"checkpoint": None, "step": 10, "why": "w"}, tuple(f"r{i}" for i in range(20)),
                        tuple(Trial(f"t{i}", "c", 10) for i in range(10)), tuple(f"s{i}" for i in range(20)),
                        tuple(f"d{i}" for i in range(20)))
    big = Analysis(**{**a.__dict__, "findings": many, "recovery": plan,
                      "skipped": tuple(Skip(f"f{i}", "r") for i in range(50))})
    md2 = render_markdown(big)
    assert len(md2.splitlines()) < MAX_LINES
    assert "X00" in md2 and "X05" not in md2 and "of 40)" in md2
    assert "second line" in md2 and "finding 0\n" not in md2


def test_text_plain_and_color() -> None:
    """Plain text has no escape codes; colour output has ANSI codes and the same words."""
    a = anomaly()
    plain = render_text(a, color=False)
    assert "\x1b[" not in plain
    assert "ANOMALY" in plain and "update_scale_growth / lr_too_high" in plain
    assert "step 450 (segment 1)" in plain and "step 400 (ckpt/step_400): newest finite checkpoint" in plain
    assert "lr x0.5" in plain
    assert plain.count("evidence:") == 3 and "(+0 more" not in plain
    colored = render_text(a, color=True)
    assert "\x1b[" in colored and "ANOMALY" in colored
    assert "HEALTHY" in render_text(healthy(), color=False)
    assert len(render_text(a, color=False).splitlines()) <= 20
    verbose = render_text(a, color=False, verbose=True)
    assert verbose.count("evidence:") == len(a.findings) and "--verbose" not in verbose
    assert "lr x0.25" in verbose and "no checkpoints found" in verbose


# ----------------------------------------------------------------------------------- size bound


def test_million_step_report_stays_small() -> None:
    """A 1M-step run (3 metrics, 2 segments, NaN tail) renders to < 5 MB, extremes and non-finite kept."""
    n = 1_000_000
    steps = np.arange(n, dtype=np.int64)
    segments = (steps >= 600_000).astype(np.int32)
    rng = np.random.default_rng(1)
    loss = 3 + np.exp(-steps / 2e5) + 0.05 * rng.standard_normal(n)
    loss[990_000:] = math.nan
    grad = np.abs(1 + 0.2 * rng.standard_normal(n))
    grad[989_000:990_000] *= np.linspace(1, 1e4, 1000)
    lr = np.minimum(1.0, (steps + 1) / 2000) * 3e-4
    metrics = metrics_frame({"loss": loss, "lr": lr, "grad_norm": grad}, steps, segments, run="big")
    r = RunData("big", metrics, pl.from_arrow(empty_events()), {}, [SourceInfo("m.jsonl", "jsonl", n, 2)], [])
    a = Analysis(**{**anomaly(run="big").__dict__, "onset": {"step": 989_000, "segment": 1}})
    t0 = time.perf_counter()
    html = render_html(a, r)
    elapsed = time.perf_counter() - t0
    size = len(html.encode("utf-8"))
    assert size < 5_000_000, size
    assert 'id="zoom-loss"' in html and "10,000 NaN" in html
    assert elapsed < 60, elapsed


# ----------------------------------------------------------------------------------- plain words, consistency


def _with(a: Analysis, **kw: object) -> Analysis:
    return Analysis(**{**a.__dict__, **kw})


def test_glossary_covers_every_cause() -> None:
    """Every cause family and verdict has plain words; the headline uses no cause code."""
    from reports._plain import explain, headline

    for cause in CAUSES:
        assert explain(cause), cause
    for verdict in ("anomaly", "transient", "healthy"):
        assert explain(verdict), verdict
    line = headline(anomaly())
    assert "step 450" in line and "update_scale_growth" not in line and line.endswith(".")


def test_headline_names_a_resume() -> None:
    """An onset at the first step of a resumed segment is said as 'when the job resumed at step N'."""
    from reports._plain import headline

    f = Finding("LR01", "lr.schedule_reset", "lr_schedule_reset", "reset_to_initial", 300, 1, 0.9, "high", "m")
    a = _with(anomaly(), cause="lr_schedule_reset", mechanism="reset_to_initial", findings=(f,),
              onset={"step": 300, "segment": 1})
    assert headline(a, make_run()) == ("The learning-rate schedule restarted from the beginning when the job resumed "
                                       "at step 300.")


def test_consistency_pass_drops_contradicted_hypothesis_text(run: RunData) -> None:
    """Contradicted hypothesis sentences are left out (and listed as left out in the HTML).

    'without a spike' beside a spike finding, 'no grad-norm series confirms' beside a grad-norm finding.
    """
    from reports._plain import consistent

    spike = Finding("SP01", "loss.spike", None, None, 460, 1, 0.9, "high", "loss spike", {"metric": "loss", "z": 94.0})
    gn = Finding("GN01", "grad_norm.departure", None, None, 455, 1, 0.8, "high", "grad norm 20x",
                 {"metric": "grad_norm", "z": 20.0})
    rising = "the loss turns and keeps rising without a spike: the slow-divergence signature"
    unconfirmed = "no grad-norm, update-ratio or attention-logit series confirms the growth"
    h = Hypothesis("update_scale_growth", "lr_too_high", 0.55, ("DV01 step 450: diverges", rising), (unconfirmed,))
    a = _with(anomaly(), findings=(*anomaly().findings, spike, gn), hypotheses=(h,))
    cons = consistent(a, run)
    assert cons.hypotheses[0].support == ("DV01 step 450: diverges",) and cons.hypotheses[0].against == ()
    whys = {r.text: r.why for r in cons.removed}
    assert "SP01" in whys[rising] and "z=94" in whys[rising] and "on grad_norm" in whys[unconfirmed]
    html = render_html(a, run)
    hyp = html[html.index('<ol class="hyp">'):html.index("</ol>", html.index('<ol class="hyp">'))]
    assert rising not in hyp and unconfirmed not in hyp and 'id="removed"' in html
    kept = Hypothesis("update_scale_growth", "lr_too_high", 0.55, (rising,), (unconfirmed,))
    assert consistent(_with(anomaly(), hypotheses=(kept,)), run).hypotheses[0].support == (rising,)


def test_criteria_the_failed_run_already_met_are_not_criteria() -> None:
    """A criterion the failed run met after its onset is left out; one it failed stays."""
    from reports._plain import consistent

    band = "past the onset, the loss stays within 3 robust sigmas of the pre-onset level (1.6 +- 0.5) or below it"
    spike = "no loss spike beyond 6 robust sigmas of the trailing 128 steps through the 150-step trial"
    healthy_after = "`forensics analyze` on the trial run reports it healthy"
    plan = RecoveryPlan({"checkpoint": "c", "step": 400, "why": "w"}, (), (Trial("t", "c", 150),),
                        (spike, band, healthy_after))
    a = _with(anomaly(), recovery=plan, onset={"step": 300, "segment": 1})
    steps = np.arange(500, dtype=np.int64)
    flat = metrics_frame({"loss": 1.6 + 0.01 * np.sin(steps)}, steps, (steps >= 300).astype(np.int32))
    flat_run = RunData("flat", flat, pl.from_arrow(empty_events()), {}, [], [])
    cons = consistent(a, flat_run)
    assert cons.success_criteria == (healthy_after,)
    assert {r.text for r in cons.removed} == {band, spike}
    diverging = consistent(_with(a, onset={"step": 450, "segment": 1}), make_run())
    assert band in diverging.success_criteria and healthy_after in diverging.success_criteria
    assert band not in render_markdown(a, run=flat_run) and band in render_markdown(a)


def test_onset_window_is_sized_to_the_chain() -> None:
    """On a 150k-step run the window spans the causal chain plus a margin, not 10% of the run."""
    from reports.interactive import chain_window

    n = 150_000
    steps = np.arange(n, dtype=np.int64)
    r = RunData("long", metrics_frame({"loss": np.ones(n) + 1e-3 * np.sin(steps), "step_time": 0.5 + 0 * steps},
                                      steps, np.zeros(n, np.int32)), pl.from_arrow(empty_events()), {}, [], [])
    f1 = Finding("ST01", "stall.step_time", "hardware_or_distributed", None, 100_000, 0, 0.7, "high", "slow",
                 {"metric": "step_time"})
    f2 = Finding("NF01", "nonfinite.first", None, None, 100_200, 0, 1.0, "critical", "nan", {"series": "loss"})
    a = _with(anomaly(run="long"), findings=(f1, f2), onset={"step": 100_000, "segment": 0},
              cause="hardware_or_distributed", mechanism=None)
    lo, hi = chain_window(a, r)
    assert lo <= 100_000 and hi >= 100_200 and hi - lo < 1_000
    main, zoom, _ = chart_plan(a, r)
    assert zoom == ["loss", "step_time"]


def test_chain_codes_name_a_repeated_finding_once() -> None:
    """The "around the onset" sentence names each code once, a repeated one with its count, in chain order."""
    from types import SimpleNamespace

    from reports.interactive import chain_codes

    found = [SimpleNamespace(code=c) for c in ["INT01"] * 999 + ["ST01", "INT01"]]
    assert chain_codes(found) == ["INT01 x1000", "ST01"]
    assert chain_codes([SimpleNamespace(code="NF01")]) == ["NF01"] and chain_codes([]) == []


def test_constant_series_collapse_and_chain_series_get_charts() -> None:
    """A constant loss scale is one line of text; a step-time finding gets a step-time chart and its row links it."""
    n = 400
    steps = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(3)
    cols = {"loss": 2 + 0.1 * rng.standard_normal(n), "loss_scale": np.ones(n),
            "step_time": 0.5 + 0.01 * rng.standard_normal(n)}
    cols["step_time"][300:] *= 3
    r = RunData("st", metrics_frame(cols, steps, np.zeros(n, np.int32)), pl.from_arrow(empty_events()), {}, [], [])
    f = Finding("ST01", "stall.step_time", "hardware_or_distributed", None, 300, 0, 0.7, "high", "3x slower",
                {"metric": "step_time"})
    a = _with(anomaly(run="st"), findings=(f,), onset={"step": 300, "segment": 0}, cause="hardware_or_distributed",
              mechanism=None, hypotheses=())
    html = render_html(a, r)
    assert "loss_scale: constant 1 over 400 points" in html and 'id="chart-loss_scale"' not in html
    assert 'id="zoom-step_time"' in html and 'id="chart-step_time"' in html
    assert 'data-chart="chart-step_time" data-step="300"' in html


def test_finding_rows_link_to_their_chart_at_their_step(run: RunData) -> None:
    """Every finding with a step links to the chart of the metric it used."""
    html = render_html(anomaly(), run)
    assert 'href="#chart-grad_norm" data-chart="chart-grad_norm" data-step="450"' in html
    assert 'data-chart="chart-loss" data-step="499"' in html


def test_hostile_metric_names_stay_text(run: RunData) -> None:
    """Metric names from the logs never become markup or TeX: escaped in the page, absent from Bokeh text."""
    n = 200
    steps = np.arange(n, dtype=np.int64)
    bad = "</script><script>alert(1)</script>"
    r = RunData("x", metrics_frame({"loss": np.linspace(3, 2, n), bad: np.linspace(0, 1, n), "$$\\alpha$$": np.ones(n)},
                                   steps, np.zeros(n, np.int32)), pl.from_arrow(empty_events()), {}, [], [])
    f = Finding("X01", "x.y", "update_scale_growth", None, 150, 0, 0.5, "low", "m", {"metric": bad})
    html = render_html(_with(anomaly(run="x"), findings=(f,), onset={"step": 150, "segment": 0}), r)
    assert "<script>alert(1)" not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in html


def test_markdown_blocks_are_paste_ready_and_render_as_commonmark() -> None:
    """TrainingArguments keys and a Megatron command line come as fenced, untruncated blocks (never a list)."""
    from markdown_it import MarkdownIt

    hf = {"resume_from_checkpoint": "output/checkpoint-400", "learning_rate": 1.5e-4, "warmup_steps": 50,
          "max_grad_norm": 1.0, "bf16": True, "fp16": False}
    flags = ["--lr 1.5e-05", "--override-opt_param-scheduler", "--lr-warmup-iters 50", "--clip-grad 1.0"]
    md_parser = MarkdownIt("commonmark").enable("table")
    for settings, lang, must in (
        ({"peak_lr_factor": 0.5, "hf_training_arguments": hf}, "python",
         [f"{k}={v!r}," for k, v in hf.items()]),
        ({"peak_lr_factor": 0.5, "megatron_flags": flags}, "bash", ["--load ckpt/step_400 \\", *flags[:-1]]),
    ):
        a = anomaly()
        plan = RecoveryPlan(a.recovery.resume_from, a.recovery.restore,  # type: ignore[union-attr]
                            (Trial("lr x0.5", "peak lr x0.5", 150, settings), *a.recovery.trials[1:]),  # type: ignore[union-attr]
                            a.recovery.success_criteria)  # type: ignore[union-attr]
        md = render_markdown(_with(a, recovery=plan), html_path="r.html")
        assert len(md.splitlines()) < MAX_LINES
        fences = [t for t in md_parser.parse(md) if t.type == "fence"]
        assert [t.info for t in fences] == [lang], md
        for text in must:
            assert text in fences[0].content, (text, fences[0].content)
        assert "[--lr" not in md and "\u2026" not in fences[0].content
        if lang == "python":  # valid Python as pasted (the ``...`` stands for the other arguments)
            compile(fences[0].content, "<TrainingArguments block>", "eval")
        else:  # a shell command line bash accepts, flags as words (not a list literal)
            import subprocess

            assert subprocess.run(["bash", "-n"], input=fences[0].content, text=True).returncode == 0
        html = md_parser.render(md)
        assert "<table>" not in html or "</table>" in html
        assert "```" not in html  # every fence closed and parsed


def test_markdown_code_spans_hold_backticks() -> None:
    """A run name with backticks stays one code span."""
    from markdown_it import MarkdownIt

    md = render_markdown(anomaly(run="runs/`odd`name"))
    first = MarkdownIt("commonmark").parseInline(md.splitlines()[0].lstrip("# "))[0].children
    assert [t.type for t in first].count("code_inline") == 1 and first[-1].content == "runs/`odd`name"


def test_no_precursor_claim_beside_a_precursor_finding() -> None:
    """'with no precursor in the previous 50 steps' beside a grad-norm departure 4 steps earlier is left out."""
    from reports._plain import consistent

    claim = "DB01 step 460: abrupt loss spike at step 460 with no precursor in the previous 50 steps."
    gn = Finding("GN01", "grad_norm.departure", None, None, 456, 1, 0.8, "high", "grad norm 20x",
                 {"metric": "grad_norm"})
    h = Hypothesis("data_batch", "bad_batch", 0.6, (claim,))
    cons = consistent(_with(anomaly(), findings=(gn,), hypotheses=(h,)))
    assert cons.hypotheses[0].support == () and "GN01" in cons.removed[0].why and "4 step(s)" in cons.removed[0].why
    far = Finding("GN01", "grad_norm.departure", None, None, 300, 1, 0.8, "high", "g", {"metric": "grad_norm"})
    assert consistent(_with(anomaly(), findings=(far,), hypotheses=(h,))).hypotheses[0].support == (claim,)
