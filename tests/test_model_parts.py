"""The one Q/K/V name table (forensics/model_parts.py) that AT01 and CK02 share.

Before it, CK02 (checkpoint_update_growth.py) looked module names up in a dict and AT01
(attention_logit_growth.py) matched metric-name endings with a regex; every name either accepted must still
map to the same role, and both detectors must still pair a layer's Q, K and V.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from forensics.detectors.attention_logit_growth import AttentionLogitGrowth
from forensics.detectors.checkpoint_update_growth import CheckpointUpdateGrowth
from forensics.model import Mechanism, RunData
from forensics.model_parts import QKV_PROJECTIONS, qkv_role

# the keys of CK02's former dict, with their roles
CK02_NAMES = {"q_proj": "q", "q": "q", "query": "q", "wq": "q", "to_q": "q", "q_lin": "q",
              "k_proj": "k", "k": "k", "key": "k", "wk": "k", "to_k": "k", "k_lin": "k",
              "v_proj": "v", "v": "v", "value": "v", "wv": "v", "to_v": "v", "v_lin": "v"}
# names AT01's former regex ``^(.*?)(q|k|v)(?:_proj|proj)?(\.weight)?$`` (case-insensitive) accepted
AT01_NAMES = {"q_proj": "q", "qproj": "q", "q": "q", "q.weight": "q", "q_proj.weight": "q", "wq": "q",
              "to_q": "q", "attn_q": "q", "layers.0.q.weight": "q", "Q_PROJ": "q", "k_proj": "k", "kproj": "k",
              "k.weight": "k", "wk": "k", "to_k": "k", "v_proj": "v", "vproj": "v", "v.weight": "v", "wv": "v",
              "to_v": "v", "V": "v"}


@pytest.mark.parametrize(("name", "role"), sorted(CK02_NAMES.items()))
def test_checkpoint_names_still_map(name: str, role: str) -> None:
    """Every module name CK02's dict knew keeps its role."""
    assert qkv_role(name) == role


@pytest.mark.parametrize(("name", "role"), sorted(AT01_NAMES.items()))
def test_metric_name_endings_still_map(name: str, role: str) -> None:
    """Every name ending AT01's regex accepted keeps its role."""
    assert qkv_role(name) == role


def test_table_holds_every_checkpoint_name() -> None:
    """The table is CK02's former dict, name for name."""
    assert QKV_PROJECTIONS == CK02_NAMES


@pytest.mark.parametrize("name", ["qkv", "qkv_proj", "kv_proj", "to_kv", "c_attn", "out_proj", "o_proj", "proj",
                                  "up_proj", "gate_proj", "lm_head", "q_norm", "weight", ""])
def test_other_and_fused_names_have_no_role(name: str) -> None:
    """Other modules and fused projections (whose Q, K and V rows cannot be told apart) have no role."""
    assert qkv_role(name) is None


def _run(cols: dict[str, np.ndarray], tensors: pl.DataFrame | None = None) -> RunData:
    """A RunData with one long metrics table, every column on steps 0, 10, 20, ..."""
    steps = np.arange(len(next(iter(cols.values())))) * 10
    frames = [pl.DataFrame({"run": "case", "segment": np.zeros(steps.size, dtype=np.int32), "step": steps,
                            "metric": m, "value": np.asarray(v, dtype=np.float64), "wall_time": None, "tag": m,
                            "source": "metrics.jsonl"}, schema_overrides={"wall_time": pl.Float64})
              for m, v in cols.items()]
    return RunData(run="case", metrics=pl.concat(frames), events=pl.DataFrame(), meta={}, sources=[], skipped=[],
                   tensors=tensors if tensors is not None else pl.DataFrame())


STYLES = {"hf": ("q_proj", "k_proj", "v_proj"), "llama": ("wq", "wk", "wv"), "diffusers": ("to_q", "to_k", "to_v"),
          "bert": ("query", "key", "value"), "distilbert": ("q_lin", "k_lin", "v_lin"), "plain": ("q", "k", "v")}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_at01_pairs_each_naming_style(style: str) -> None:
    """AT01 pairs each layer's Q/K/V norms under every naming style and flags the layer whose Q/K grow."""
    t = np.arange(40, dtype=float)
    grow = np.where(t < 20, 1.0, np.exp(0.08 * (t - 20)))
    cols = {f"weight_norm/layer{layer}/{part}": (grow if layer == 0 and w != "v" else 1.0 + 0.001 * t)
            for layer in (0, 1) for w, part in zip("qkv", STYLES[style], strict=True)}
    run = _run(cols)
    det = AttentionLogitGrowth()
    assert sorted(det._qkv_triples(run)) == ["weight_norm/layer0/", "weight_norm/layer1/"]  # noqa: SLF001
    found = det.detect(run)
    assert len(found) == 1 and found[0].evidence["layer"] == "weight_norm/layer0/"


@pytest.mark.parametrize("style", sorted(STYLES))
def test_ck02_pairs_each_naming_style(style: str) -> None:
    """CK02 pairs each layer's Q/K/V weights in checkpoints under every naming style."""
    steps = [100, 200, 300, 400]
    growth = {"q": [1, 1.6, 2.3, 3.0], "k": [1, 1.5, 2.2, 3.1], "v": [1, 1.05, 1.1, 1.1]}
    rows = [{"run": "case", "step": s, "checkpoint": f"ckpt/step_{s}", "tensor": f"l.0.attn.{part}.weight",
             "role": "param", "dtype": "F32", "shape": [8, 8], "numel": 64, "l2": growth[w][i], "rms": growth[w][i] / 8,
             "max_abs": growth[w][i], "n_nan": 0, "n_inf": 0, "n_zero": 0}
            for w, part in zip("qkv", STYLES[style], strict=True) for i, s in enumerate(steps)]
    run = _run({"loss": np.linspace(3.0, 2.0, 41)}, tensors=pl.DataFrame(rows))
    found = [f for f in CheckpointUpdateGrowth().detect(run) if f.mechanism == Mechanism.ATTENTION_LOGIT_GROWTH]
    assert len(found) == 1 and found[0].evidence["layers"][0]["layer"] == "l.0.attn"
