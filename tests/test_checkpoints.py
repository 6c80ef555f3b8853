"""Checkpoint readers, tables, detectors and recovery (issue 4).

Files are written by the real writers (``safetensors.torch.save_file``, ``torch.save``) when they are
installed; the readers under test never import torch or safetensors themselves.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.model import RunData
from parsers import safetensors_ckpt as sc
from parsers import torch_ckpt as tc
from parsers.checkpoints import read_checkpoints

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"


def _values(ref: sc.TensorRef, **kw: int) -> np.ndarray:
    return np.concatenate([b.copy() for b in sc.iter_blocks(ref, **kw)] or [np.empty(0)])


def _reference(x: np.ndarray) -> dict[str, float]:
    x = x.astype(np.float64).reshape(-1)
    fin = x[np.isfinite(x)]
    return {"numel": x.size, "l2": math.sqrt(float(np.sum(fin * fin))), "max_abs": float(np.max(np.abs(fin))),
            "n_nan": int(np.isnan(x).sum()), "n_inf": int(np.isinf(x).sum()), "n_zero": int((x == 0).sum())}


def _st_file(tmp_path: Path) -> tuple[Path, dict]:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(300, 70, generator=g) * 3
    base[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 1e-40])
    tensors = {
        "w_f32": base.clone(), "w_bf16": base.to(torch.bfloat16), "w_f16": (base / 100).to(torch.float16),
        "w_f64": base.double(), "w_e4m3": (base / 10).to(torch.float8_e4m3fn), "w_e5m2": base.to(torch.float8_e5m2),
        "i32": torch.arange(-50, 50, dtype=torch.int32), "u8": torch.arange(0, 200, dtype=torch.uint8),
        "mask": torch.arange(10) % 3 == 0, "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "model.safetensors"
    st.save_file(tensors, str(path), metadata={"step": "7"})
    return path, tensors


def test_safetensors_stats_match_reference(tmp_path: Path) -> None:
    """bf16 decoded bit-exactly; stats equal numpy float64 references (counts exact, l2 to 1e-12)."""
    pytest.importorskip("ml_dtypes")  # the FP8 tensors
    path, tensors = _st_file(tmp_path)
    refs, meta, skipped = sc.read_header(path)
    assert meta == {"step": "7"} and not skipped
    assert [r.offset for r in refs] == sorted(r.offset for r in refs)
    for ref in refs:
        t = tensors[ref.name]
        exact = t.float().numpy() if t.dtype.is_floating_point else t.numpy().astype(np.float64)
        got = _values(ref, chunk_bytes=4096, block=1000)  # many chunks and blocks
        assert np.array_equal(got, exact.reshape(-1), equal_nan=True), ref.name
        st = sc.tensor_stats(ref)
        if t.numel() == 0:
            assert st["numel"] == 0 and st["l2"] == 0.0
            continue
        want = _reference(exact)
        for k in ("numel", "n_nan", "n_inf", "n_zero", "max_abs"):
            assert st[k] == want[k], (ref.name, k)
        assert st["l2"] == pytest.approx(want["l2"], rel=1e-12), ref.name
        assert st["rms"] == pytest.approx(want["l2"] / math.sqrt(want["numel"] - want["n_nan"] - want["n_inf"]))


def test_truncated_and_hostile_safetensors_are_skips(tmp_path: Path) -> None:
    """Truncated file, out-of-range offsets, absurd header length, overlap: refused, no big allocation."""
    path, _ = _st_file(tmp_path)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "truncated.safetensors").write_bytes(data[: len(data) - 100])
    header = {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}}
    hb = json.dumps(header).encode()
    (bad / "offsets.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb + b"\0" * 16)
    (bad / "huge.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"{" + b" " * 64)
    over = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    ob = json.dumps(over).encode()
    (bad / "overlap.safetensors").write_bytes(struct.pack("<Q", len(ob)) + ob + b"\0" * 24)
    tracemalloc.start()
    for name, words in (("truncated", "truncated"), ("offsets", "truncated or corrupt"), ("huge", "exceeds"),
                        ("overlap", "overlap")):
        with pytest.raises(sc.CheckpointError, match=words):
            sc.read_header(bad / f"{name}.safetensors")
    assert tracemalloc.get_traced_memory()[1] < 8 << 20
    tracemalloc.stop()
    tensors, updates, meta, skipped = read_checkpoints(bad, "bad")
    assert tensors.height == 0 and updates.height == 0
    assert {Path(s.what).name for s in skipped} == {f"{k}.safetensors" for k in ("truncated", "offsets", "huge",
                                                                                   "overlap")}
    assert meta and meta[0]["complete"] is False


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_not_run(tmp_path: Path) -> None:
    """A checkpoint whose pickle calls os.system is refused with the global named; nothing runs."""
    torch = pytest.importorskip("torch")
    marker = tmp_path / "pwned"
    run = tmp_path / "run" / "checkpoint-10"
    run.mkdir(parents=True)
    torch.save({"w": torch.ones(3), "x": _Evil(marker)}, run / "pytorch_model.bin")
    with pytest.raises(sc.CheckpointError, match=r"refused: pickle wants to import (os|posix)\.system"):
        tc.load(run / "pytorch_model.bin")
    # a bare pickle inside a hand-made zip too
    with zipfile.ZipFile(run / "evil.pt", "w") as zf:
        zf.writestr("evil/data.pkl", pickle.dumps(_Evil(marker)))
    tensors, _, meta, skipped = read_checkpoints(tmp_path / "run", "run")
    assert not marker.exists()
    reasons = [s.reason for s in skipped]
    assert len(reasons) == 2 and all(r.startswith("refused: pickle wants to import") for r in reasons)
    assert tensors.height == 0 and meta[0]["step"] == 10


def test_restricted_reader_matches_torch_load(tmp_path: Path) -> None:
    """Optimizer and scheduler state read without torch equal what torch.load returns."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-6)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 5)).pow(2).sum().backward()
        opt.step()
        sched.step()
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    torch.save(sched.state_dict(), tmp_path / "scheduler.pt")
    torch.save({"model": model.state_dict(), "t": model[0].weight.detach().t(), "s": torch.arange(10.0)[3:8]},
               tmp_path / "bundle.pt")
    want = torch.load(tmp_path / "optimizer.pt", weights_only=True)
    c = tc.classify(tc.load(tmp_path / "optimizer.pt"))
    (o,) = c.optimizers
    assert o["param_groups"][0]["lr"] == want["param_groups"][0]["lr"] == pytest.approx(1e-4)
    assert tuple(o["param_groups"][0]["betas"]) == (0.9, 0.95) and o["param_groups"][0]["eps"] == 1e-6
    for idx, key, ref in tc.optimizer_tensors(o):
        assert np.array_equal(_values(ref), want["state"][idx][key].numpy().reshape(-1)), (idx, key)
    assert tc.scalar(o["state"][0]["step"]) == float(want["state"][0]["step"])
    (s,) = tc.classify(tc.load(tmp_path / "scheduler.pt")).schedulers
    assert s["last_epoch"] == 3 and s["_step_count"] == 4 and s["base_lrs"] == [1e-3]
    b = tc.classify(tc.load(tmp_path / "bundle.pt"))
    assert [n for n, _ in b.params] == list(model.state_dict())
    other = dict(b.other)
    assert other["t"].stride is not None  # a transposed view, materialised (small)
    assert np.array_equal(_values(other["t"]), model[0].weight.detach().t().numpy().reshape(-1))
    assert np.array_equal(_values(other["s"]), np.arange(3.0, 8.0))


def _two_checkpoints(tmp_path: Path) -> tuple[Path, list[dict]]:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(1)
    states = []
    for step in (10, 20):
        sd = {"blocks.0.attn.q.weight": torch.randn(64, 64, generator=g),
              "blocks.0.attn.q.bias": torch.randn(64, generator=g),
              "blocks.1.mlp.weight": torch.randn(128, 64, generator=g).to(torch.bfloat16),
              "head.weight": torch.randn(300, 64, generator=g)}
        d = tmp_path / "run" / "ckpt" / f"step_{step}"
        d.mkdir(parents=True)
        st.save_file(sd, str(d / "model.safetensors"))
        states.append({k: v.float().numpy().astype(np.float64) for k, v in sd.items()})
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    return tmp_path / "run", states


def test_updates_equal_direct_numpy(tmp_path: Path) -> None:
    """delta_l2, weight_l2 and ratio per tensor, per layer and overall equal a direct numpy computation."""
    run, (a, b) = _two_checkpoints(tmp_path)
    tensors, updates, meta, skipped = read_checkpoints(run, "run")
    assert not skipped and [m["step"] for m in meta] == [10, 20] and tensors.height == 8
    rows = {r["tensor"]: r for r in updates.iter_rows(named=True)}
    groups = {k: [k] for k in a} | {"blocks.0.*": ["blocks.0.attn.q.weight", "blocks.0.attn.q.bias"],
                                   "blocks.1.*": ["blocks.1.mlp.weight"], "*": list(a)}
    assert set(rows) == set(groups)
    for name, members in groups.items():
        d = math.sqrt(sum(float(np.sum((b[k] - a[k]) ** 2)) for k in members))
        w = math.sqrt(sum(float(np.sum(a[k] ** 2)) for k in members))
        r = rows[name]
        assert (r["step_from"], r["step_to"]) == (10, 20)
        assert r["delta_l2"] == pytest.approx(d, rel=1e-12) and r["weight_l2"] == pytest.approx(w, rel=1e-12)
        assert r["ratio"] == pytest.approx(d / w, rel=1e-12)


def test_no_checkpoints_costs_nothing(tmp_path: Path) -> None:
    """A folder without checkpoint files gives empty tables with the schema and no meta."""
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    tensors, updates, meta, skipped = read_checkpoints(tmp_path, "x")
    assert tensors.height == 0 and "l2" in tensors.columns and "ratio" in updates.columns
    assert meta == [] and skipped == []


def test_sharded_dcp_and_deepspeed_completeness(tmp_path: Path) -> None:
    """Missing shard, DCP without .metadata, DeepSpeed without a rank: each named as a skip, incomplete."""
    run, _ = _two_checkpoints(tmp_path)
    d = run / "ckpt" / "step_20"
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "head.weight": "model-00001-of-00002.safetensors", "extra.weight": "model-00002-of-00002.safetensors"}}))
    dcp = run / "checkpoints" / "step-30"
    dcp.mkdir(parents=True)
    (dcp / "__0_0.distcp").write_bytes(b"\0" * 10)
    ds = run / "global_step40"
    ds.mkdir()
    for f in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
              "zero_pp_rank_2_mp_rank_00_optim_states.pt"):
        (ds / f).write_bytes(b"PK")  # names only: the model-states file is then unreadable
    tensors, _, meta, skipped = read_checkpoints(run, "run")
    by = {m["step"]: m for m in meta}
    assert by[10]["complete"] and not by[20]["complete"] and not by[30]["complete"] and not by[40]["complete"]
    text = "\n".join(f"{s.what}: {s.reason}" for s in skipped)
    assert "model-00002-of-00002.safetensors: shard listed in model.safetensors.index.json is missing" in text
    assert "no .metadata" in text and "zero_pp_rank_1_mp_rank_00_optim_states.pt" in text
    assert set(tensors.get_column("step").unique().to_list()) == {10, 20}


def _run_with(tensors: pl.DataFrame, meta: dict | None = None, segments: tuple[int, ...] = (0,)) -> RunData:
    rows = [{"run": "r", "segment": seg, "step": s, "metric": "loss", "value": 2.0, "wall_time": None, "tag": "loss",
             "source": "m.jsonl"} for seg, (lo, hi) in zip(segments, [(1, 300), (201, 400)], strict=False)
            for s in range(lo, hi + 1)]
    return RunData(run="r", metrics=pl.DataFrame(rows), events=pl.DataFrame(), meta=meta or {}, sources=[],
                   skipped=[], tensors=tensors)


def _tensor_rows(norms: dict[str, list[float]], steps: list[int]) -> pl.DataFrame:
    rows = [{"run": "r", "step": s, "checkpoint": f"ckpt/step_{s}", "tensor": n, "role": "param", "dtype": "F32",
             "shape": [8, 8], "numel": 64, "l2": v[i], "rms": v[i] / 8, "max_abs": v[i], "n_nan": 0, "n_inf": 0,
             "n_zero": 0} for n, v in norms.items() for i, s in enumerate(steps)]
    return pl.DataFrame(rows)


def test_ck02_qk_growth_and_ck03_lost_optimizer_state() -> None:
    """Q/K norms tripling while V stays flat; an optimizer step that restarts at a logged resume."""
    from forensics.detectors.ckpt_state import CheckpointStateMismatch
    from forensics.detectors.ckpt_update_growth import CheckpointUpdateGrowth

    steps = [100, 200, 300, 400]
    t = _tensor_rows({"l.0.attn.q_proj.weight": [1, 1.6, 2.3, 3.0], "l.0.attn.k_proj.weight": [1, 1.5, 2.2, 3.1],
                      "l.0.attn.v_proj.weight": [1, 1.05, 1.1, 1.1]}, steps)
    (f,) = CheckpointUpdateGrowth().detect(_run_with(t))
    assert f.mechanism == "attention_logit_growth" and f.step == 300 and f.evidence["layers"][0]["layer"] == "l.0.attn"
    flat = _tensor_rows({"l.0.attn.q_proj.weight": [1, 1.6, 1.8, 1.85], "l.0.attn.k_proj.weight": [1, 1.6, 1.8, 1.9],
                         "l.0.attn.v_proj.weight": [1, 1.05, 1.1, 1.1]}, steps)
    assert CheckpointUpdateGrowth().detect(_run_with(flat)) == []  # early, decelerating growth is healthy
    cks = [{"step": 200, "path": "c200", "step_source": "name", "optimizer": {"step": 200},
            "scheduler": {"last_epoch": 200}},
           {"step": 300, "path": "c300", "step_source": "name", "optimizer": {"step": 100},
            "scheduler": {"last_epoch": 100}}]
    (g,) = CheckpointStateMismatch().detect(_run_with(t, {"checkpoints": cks}, segments=(0, 1)))
    assert (g.cause, g.step, g.confidence) == ("state_not_restored", 201, 0.75)
    cks[1]["optimizer"] = {"step": 300}
    (h,) = CheckpointStateMismatch().detect(_run_with(t, {"checkpoints": cks}, segments=(0, 1)))
    assert (h.cause, h.mechanism) == ("lr_schedule_reset", "reset_to_initial")
    per_epoch = [dict(c, scheduler={"last_epoch": 2}, optimizer={"step": c["step"]}) for c in cks]
    assert CheckpointStateMismatch().detect(_run_with(t, {"checkpoints": per_epoch})) == []


def test_adam_epsilon_share(tmp_path: Path) -> None:
    """An exp_avg_sq with 60% of its coordinates at sqrt(v) <= 10 eps is kept in meta and found by CK02."""
    torch = pytest.importorskip("torch")
    from forensics.detectors.ckpt_update_growth import CheckpointUpdateGrowth

    v = torch.full((64, 64), 1e-6)
    v.view(-1)[: int(0.6 * 4096)] = 1e-16
    state = {"state": {0: {"step": torch.tensor(1000.0), "exp_avg": torch.zeros(64, 64), "exp_avg_sq": v}},
             "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": [0]}]}
    d = tmp_path / "checkpoint-1000"
    d.mkdir()
    torch.save(state, d / "optimizer.pt")
    tensors, _, meta, _ = read_checkpoints(tmp_path, "r")
    (e,) = meta[0]["adam_eps"]
    assert e["tensor"] == "param0" and e["share"] == pytest.approx(0.6, abs=1e-3)
    (f,) = CheckpointUpdateGrowth().detect(_run_with(tensors, {"checkpoints": meta}))
    assert f.mechanism == "adam_epsilon" and f.confidence < 0.5 and f.step == 1000


@pytest.mark.parametrize("name", ["ckpt_healthy", "ckpt_nonfinite_state"])
def test_sample_checkpoint_runs(name: str) -> None:
    """The committed checkpoint runs get their expected verdict; the resume point is a finite checkpoint."""
    from forensics.api import analyze, load

    run = SAMPLES / name
    if not (run / "expected.json").is_file():
        pytest.skip("sample run not generated")
    exp = json.loads((run / "expected.json").read_text())
    a = analyze(run)
    assert (a.verdict, a.cause, a.mechanism) == (exp["verdict"], exp["cause"], exp["mechanism"]), a.summary
    data = load(run)
    roles = dict(data.tensors.group_by("role").len().iter_rows())
    assert roles["param"] == roles["exp_avg"] == roles["exp_avg_sq"] == 5 * 37 and data.updates.height > 0
    assert set(data.tensors.filter(pl.col("role") == "exp_avg").get_column("tensor")) == set(
        data.tensors.filter(pl.col("role") == "param").get_column("tensor"))  # named via param_names
    assert not any("no parser recognised" in s.reason for s in a.skipped)
    if exp["onset_window"]:
        lo, hi = exp["onset_window"]
        assert a.onset is not None and lo <= a.onset["step"] <= hi
        ck = next(f for f in a.findings if f.code == "CK01")
        assert ck.evidence["tensors"][0] == {"tensor": "blocks.1.mlp.0.weight", "role": "exp_avg_sq", "n_nan": 0,
                                             "n_inf": 1, "numel": 1024, "shape": [64, 16]}
        assert ck.evidence["previous_finite_checkpoint_step"] == 100
        rf = a.recovery.resume_from  # type: ignore[union-attr]
        assert rf["checkpoint"] in ("ckpt/step_50", "ckpt/step_100") and "all finite" in rf["why"]


def test_recovery_says_why_no_checkpoint_qualifies() -> None:
    """When every checkpoint before the onset holds NaN/inf, the plan names none and says why."""
    from forensics.recovery import plan

    t = _tensor_rows({"w": [1.0, 1.0]}, [100, 200]).with_columns(n_inf=pl.lit(1, dtype=pl.Int64))
    p = plan(_run_with(t), "overflow", "nonfinite_state", 250)
    assert p is not None and p.resume_from["checkpoint"] is None
    assert "no checkpoint before the onset 250 qualifies" in p.resume_from["why"]
    assert "step 100 has 1 of 1 tensors non-finite" in p.resume_from["why"]
