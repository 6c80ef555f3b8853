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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.model import RunData
from parsers import _tensor_kernels as kernels
from parsers import safetensors_ckpt as sc
from parsers import tensors
from parsers import torch_ckpt as tc
from parsers._tensor_kernels import Moments
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
    """A cut file keeps its complete tensors and lists the cut ones; damage no cut explains is refused.

    Refused, with no big allocation: a cut header, a hole before offsets past the end, an absurd header
    length, a size mismatch, an overlap.
    """
    path, tensors = _st_file(tmp_path)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "truncated.safetensors").write_bytes(data[: len(data) - 100])
    (bad / "header_cut.safetensors").write_bytes(data[: 8 + n // 2])
    header = {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}}
    hb = json.dumps(header).encode()
    (bad / "offsets.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb + b"\0" * 16)
    hole = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}
    hb = json.dumps(hole).encode()
    (bad / "hole.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb + b"\0" * 16)
    (bad / "huge.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"{" + b" " * 64)
    over = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}
    ob = json.dumps(over).encode()
    (bad / "overlap.safetensors").write_bytes(struct.pack("<Q", len(ob)) + ob + b"\0" * 24)
    tracemalloc.start()
    for name, words in (("header_cut", "truncated: header length"), ("offsets", "expected 16"),
                        ("hole", "after a hole"), ("huge", "exceeds"), ("overlap", "overlap")):
        with pytest.raises(sc.CheckpointError, match=words):
            sc.read_header(bad / f"{name}.safetensors")
    h = sc.parse_header(bad / "truncated.safetensors")
    assert tracemalloc.get_traced_memory()[1] < 8 << 20
    tracemalloc.stop()
    whole = sc.parse_header(path)
    assert not whole.truncated and whole.cut == () and whole.declared_bytes == whole.file_bytes == len(data)
    lost = [r for r in whole.tensors if r.offset + r.nbytes > len(data) - 100]
    assert h.truncated and h.cut == tuple(r.name for r in lost) and len(lost) == 2  # u8 and mask
    assert h.declared_bytes == len(data) == h.file_bytes + 100
    assert [r.name for r in h.tensors] == [r.name for r in whole.tensors if r not in lost]
    for r, s in zip(lost, h.skipped, strict=True):
        assert s.what == f"{bad / 'truncated.safetensors'}:{r.name}"
        assert f"[{r.offset}, {r.offset + r.nbytes})" in s.reason and f"at byte {len(data) - 100}" in s.reason
    tensors, updates, meta, skipped = read_checkpoints(bad, "bad")
    assert set(tensors.get_column("tensor")) == {r.name for r in h.tensors} and updates.height == 0
    refused = {f"{k}.safetensors" for k in ("header_cut", "offsets", "hole", "huge", "overlap")}
    assert {s.what for s in skipped} == refused | {f"truncated.safetensors:{r.name}" for r in lost} | {
        "truncated.safetensors"}  # the cut file itself, first (the reader contract), then its cut tensors
    assert meta[0]["complete"] is False and meta[0]["truncated"] is True
    assert any(p.startswith("truncated.safetensors: truncated at byte") for p in meta[0]["problems"])


def _st_tensors() -> dict[str, tuple[str, np.ndarray]]:
    """Several tensors of the dtypes the readers treat differently (histogram, float path, integers, empty)."""
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    big = rng.standard_normal((1 << 16) + 1234).astype(np.float32) * 0.05
    big[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40]
    return {"embed": ("BF16", big.astype(ml.bfloat16)), "proj": ("F16", (big * 4).astype(np.float16)),
            "bias": ("F32", rng.standard_normal(37).astype(np.float32)), "norm": ("BF16", np.ones(10, ml.bfloat16)),
            "count": ("I64", np.arange(5, dtype=np.int64)), "empty": ("F32", np.zeros(0, np.float32)),
            "head": ("F32", rng.standard_normal((40, 8)).astype(np.float32))}


def test_cut_safetensors_keeps_complete_tensors(tmp_path: Path) -> None:
    """A file written by ``safetensors``, cut at many offsets, keeps exactly its complete tensors.

    Their statistics equal the uncut file's; each cut tensor is listed with where the file ends; a cut
    inside the header is refused.
    """
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    tensors = {k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) if d == "BF16" else torch.from_numpy(v)
               for k, (d, v) in _st_tensors().items()}
    src = tmp_path / "model.safetensors"
    st.save_file(tensors, str(src), metadata={"step": "3"})
    data = src.read_bytes()
    whole = sc.parse_header(src)
    assert {r.name: r.dtype for r in whole.tensors} == {k: d for k, (d, _) in _st_tensors().items()}
    want = {r.name: sc.tensor_stats(r) for r in whole.tensors}
    start = 8 + struct.unpack("<Q", data[:8])[0]
    ends = sorted({r.offset + r.nbytes for r in whole.tensors})
    rng = np.random.default_rng(0)
    cuts = {k + d for k in [start, *ends] for d in (-2, -1, 0, 1, 2)} | set(rng.integers(0, len(data), 60).tolist())
    cut_path = tmp_path / "cut.safetensors"
    n_cut = 0
    for k in sorted(c for c in cuts if 0 <= c < len(data)):
        cut_path.write_bytes(data[:k])
        if k < start:
            with pytest.raises(sc.CheckpointError, match="truncated"):
                sc.parse_header(cut_path)
            continue
        h = sc.parse_header(cut_path)
        complete = {r.name for r in whole.tensors if r.offset + r.nbytes <= k}
        assert {r.name for r in h.tensors} == complete, k
        assert set(h.cut) == {r.name for r in whole.tensors} - complete and h.truncated and h.metadata == {"step": "3"}
        assert [s.what.rsplit(":", 1)[1] for s in h.skipped] == list(h.cut)
        assert all(f"at byte {k} " in s.reason for s in h.skipped)
        for r in h.tensors:  # bit for bit (NaN where the uncut file has NaN: rms/max_abs of an all-NaN tensor)
            got = sc.tensor_stats(r)
            assert got.keys() == want[r.name].keys(), (k, r.name)
            assert all(got[f] == want[r.name][f] or (got[f] != got[f] and want[r.name][f] != want[r.name][f])
                       for f in got), (k, r.name)
        n_cut += 1
    assert n_cut > 30


def _write_st(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file written by hand (numpy has no bfloat16 for ``safetensors.numpy``)."""
    header, off, bufs = {}, 0, []
    for name, (dtype, x) in tensors.items():
        raw = np.ascontiguousarray(x).tobytes()
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [off, off + len(raw)]}
        bufs.append(raw)
        off += len(raw)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(bufs))


def _hostile_bits(dtype: str, n: int, seed: int) -> np.ndarray:
    """Random bit patterns of every class mixed with ordinary values, as the dtype's unsigned integer.

    NaN of both signs and many payloads, +-inf, +-0, subnormals, huge and tiny normals.
    """
    rng = np.random.default_rng(seed)
    ml = pytest.importorskip("ml_dtypes")
    ftype, utype, inf = {"BF16": (ml.bfloat16, np.uint16, 0x7F80), "F16": (np.float16, np.uint16, 0x7C00),
                         "F32": (np.float32, np.uint32, 0x7F800000)}[dtype]
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(ftype).view(utype).copy()
    special = rng.random(n) < 0.3
    x[special] = rng.integers(0, np.iinfo(utype).max, int(special.sum()), dtype=utype, endpoint=True)  # any pattern
    sign = 0x8000 if utype is np.uint16 else 0x80000000
    x[:8] = [inf, inf | sign, 0, sign, 1, sign | 1, inf - 1, inf + 1]  # +-inf, +-0, +-min subnormal, max, NaN
    return x


def _reference16(x: np.ndarray, small: float) -> dict[str, float]:
    """Straightforward float64 statistics of a whole array (finite values for the norms)."""
    fin = x[np.isfinite(x)]
    return {"numel": x.size, "l2": math.sqrt(float(np.sum(fin * fin))), "max_abs": float(np.max(np.abs(fin))),
            "n_nan": int(np.isnan(x).sum()), "n_inf": int(np.isinf(x).sum()), "n_zero": int((x == 0).sum()),
            "n_pos": int((x > 0).sum()), "n_small": int(((x > 0) & (x <= small)).sum())}


def _float_path(ref: sc.TensorRef, small: float) -> dict:
    """The same statistics by the generic float-block reducer (Moments over iter_blocks), for comparison."""
    m = Moments(small)
    for b in sc.iter_blocks(ref):
        m.add(b)
    return m.result() | {"n_small": m.n_small, "n_pos": m.n_pos}


@pytest.fixture(params=["native", "numkong", "numpy"])
def sumsq_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every way the F32/BF16/F16 statistics are taken: compiled kernel, numkong's sums of squares, numpy's.

    The compiled one-pass kernel is built by setup.py; without it numkong, without that numpy. Its own
    MonkeyPatch, so that a test's ``monkeypatch.undo()`` keeps the backend.
    """
    if request.param == "native" and kernels._native() is None:
        pytest.skip("the compiled kernel is not built (pip install ., or python setup.py build_ext --inplace)")
    if request.param == "numkong" and kernels._numkong() is None:
        pytest.skip("numkong is not installed")
    with pytest.MonkeyPatch.context() as mp:
        if request.param != "native":
            mp.setattr(kernels, "_native", lambda: None)
        if request.param == "numpy":
            mp.setattr(kernels, "_numkong", lambda: None)
        yield request.param


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_bit_kernels_equal_float64_reference(dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             sumsq_backend: str) -> None:
    """F32/BF16/F16 statistics from bit patterns equal a plain numpy float64 computation and the float path.

    On data with NaN, +-inf, +-0 and subnormals and on finite data, read in one range, in parallel ranges
    (several workers, ranges and reads smaller than the tensor) and by the float-block reducer: counts
    (NaN, inf, zero, Adam-epsilon) and max_abs identical, l2 and the update norm to float64 rounding; the
    parallel result equals the one-worker result bit for bit.
    """
    ml = pytest.importorskip("ml_dtypes")
    ftype = {"BF16": ml.bfloat16, "F16": np.float16, "F32": np.float32}[dtype]
    bits = _hostile_bits(dtype, 5 * tensors.BLOCK + 777, seed=1)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        x = bits.view(ftype).astype(np.float64)
    assert np.isnan(x).sum() > 100 and np.isinf(x).sum() >= 2 and (x == 0).sum() >= 2
    tiny = {"BF16": 1.2e-38, "F16": 6.2e-5, "F32": 1.2e-38}[dtype]
    assert np.sum((x != 0) & (np.abs(x) < tiny)) > 2  # subnormals
    clean = np.where(np.isfinite(x), bits, 0).astype(bits.dtype)
    prev = np.random.default_rng(2).standard_normal(bits.shape[0]).astype(np.float32)
    path = tmp_path / "m.safetensors"
    for label, data in (("with NaN/inf", bits), ("finite", clean)):
        _write_st(path, {"w": (dtype, data), "prev": ("F32", prev)})
        refs = sc.read(path).obj
        with np.errstate(invalid="ignore"):
            x = data.view(ftype).astype(np.float64)
            d = x - prev.astype(np.float64)
        pos = np.abs(x[np.isfinite(x) & (x > 0)])
        small = float(np.sort(pos)[pos.size // 3])  # a threshold equal to one of the values
        want, want_dsq = _reference16(x, small), float(np.sum(d * d))
        got = {"float": _float_path(refs["w"], small)} if dtype != "F32" else {}
        for mode, workers, task in (("one range", 1, 1 << 30), ("ranges", 1, 4 * tensors.BLOCK),
                                    ("parallel", 3, 4 * tensors.BLOCK)):
            monkeypatch.setattr(tensors, "WORKERS", workers)
            monkeypatch.setattr(tensors, "TASK_BYTES", task)
            monkeypatch.setattr(tensors, "READ_BYTES", tensors.BLOCK)
            tensors._POOL.clear()
            got[mode] = sc.tensor_stats(refs["w"], small_below=small)
            dsq = sc.tensor_stats(refs["w"], prev=refs["prev"])["delta_sq"]
            assert dsq == pytest.approx(want_dsq, rel=1e-12, nan_ok=True), (label, mode)
            back = sc.tensor_stats(refs["prev"], prev=refs["w"])["delta_sq"]  # F32 with another previous dtype
            assert back == pytest.approx(want_dsq, rel=1e-12, nan_ok=True), (label, mode)
        monkeypatch.undo()
        tensors._POOL.clear()
        assert got["parallel"] == got["ranges"], label  # the same ranges in another order of work: same bits
        n_fin = x.size - want["n_nan"] - want["n_inf"]
        for mode, st in got.items():
            for k in ("numel", "n_nan", "n_inf", "n_zero", "max_abs", "n_pos", "n_small"):
                assert st[k] == want[k], (label, mode, k)
            assert st["l2"] == pytest.approx(want["l2"], rel=1e-12), (label, mode)
            assert st["rms"] == pytest.approx(want["l2"] / math.sqrt(n_fin), rel=1e-12), (label, mode)
    assert math.isfinite(want_dsq)  # the finite data's update norm was compared, not NaN with NaN


def test_bit_patterns_match_ml_dtypes(sumsq_backend: str) -> None:
    """Every BF16/F16 pattern reduced alone gives numpy's/ml_dtypes' value; thresholds map to the right pattern."""
    ml = pytest.importorskip("ml_dtypes")
    bits = np.arange(1 << 16, dtype=np.uint16)
    s = kernels.Scratch(1 << 16)
    for dtype, ftype in (("BF16", ml.bfloat16), ("F16", np.float16)):
        with np.errstate(invalid="ignore"):
            ref = bits.view(ftype).astype(np.float64)
        fin = np.isfinite(ref)
        assert np.array_equal(fin, (bits & 0x7FFF) < kernels.KINDS[dtype].inf)
        for p in np.flatnonzero(fin & (bits < 0x8000))[::97]:  # every 97th positive finite pattern
            assert kernels.pattern_value(dtype, int(p)) == ref[p]
            acc = kernels.Acc()
            kernels.reduce_bits(dtype, bits[p:p + 1], acc, s)
            assert acc.sumsq == ref[p] ** 2 and acc.top == p, (dtype, p)
            assert kernels.small_pattern(dtype, float(ref[p])) == p  # patterns 1..p are <= that value
        acc = kernels.Acc()
        kernels.reduce_bits(dtype, bits, acc, s)  # all 65536 at once: every finite square exact, float64 sums
        assert acc.sumsq == pytest.approx(math.fsum((ref[fin] ** 2).tolist()), rel=1e-13, abs=0.0)
        assert acc.n_nan == int(np.isnan(ref).sum()) and acc.n_inf == 2 and acc.n_zero == 2
    for v in (1e-8, 0.1, 3.0, float(np.float32(0.1))):
        p = kernels.small_pattern("F32", v)
        below = float(np.array(p, np.uint32).view(np.float32))
        above = float(np.array(p + 1, np.uint32).view(np.float32))
        assert below <= v < above, v


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_16bit_kernel_exact_against_float64_on_random_tensors(dtype: str, sumsq_backend: str) -> None:
    """The 16-bit path (BF16 two patterns per uint32, F16 widened and shifted; BLAS rows) against float64.

    Random tensors of lengths at and around the row and block boundaries (odd ones leave a pattern without a
    pair), with NaN of both signs, +-inf, +-0 and subnormals, reduced block by block as the reader does:
    the counts and max_abs equal the float64 reference, the sum of squares is within 1e-13 of the correctly
    rounded sum of the float64 squares (``math.fsum``), and tensors of -0 only or of subnormals only are exact.
    """
    ml = pytest.importorskip("ml_dtypes")
    ftype = {"BF16": ml.bfloat16, "F16": np.float16}[dtype]
    block, row = tensors.BLOCK, kernels.ROW
    s = kernels.Scratch(block)
    lengths = (1, 2, 3, row - 1, row, row + 1, 3 * row + 5, block - 1, block, block + 1, 3 * block + 777)
    for seed, n in enumerate(lengths):
        bits = _hostile_bits(dtype, n, seed=10 + seed) if n >= 8 else _hostile_bits(dtype, 8, seed)[-n:]
        with np.errstate(invalid="ignore"):
            x = bits.view(ftype).astype(np.float64)
        acc = kernels.Acc()
        for j in range(0, n, block):
            kernels.reduce_bits(dtype, bits[j:j + block], acc, s)
        fin = x[np.isfinite(x)]
        exact = math.fsum((fin * fin).tolist())
        assert acc.sumsq == pytest.approx(exact, rel=1e-13, abs=0.0), (dtype, n)
        got = acc.result(dtype)
        assert got["n_nan"] == int(np.isnan(x).sum()) and got["n_inf"] == int(np.isinf(x).sum()), (dtype, n)
        assert got["n_zero"] == int((x == 0).sum()) and got["numel"] == n, (dtype, n)
        assert got["max_abs"] == (float(np.max(np.abs(fin))) if fin.size else 0.0) or not fin.size, (dtype, n)
    sub = np.arange(1, {"BF16": 0x80, "F16": 0x400}[dtype], dtype=np.uint16)  # every positive subnormal
    for bits in (np.full(1001, 0x8000, np.uint16), np.concatenate([sub, sub | 0x8000])):
        x = bits.view(ftype).astype(np.float64)
        acc = kernels.Acc()
        kernels.reduce_bits(dtype, bits, acc, s)
        assert acc.sumsq == math.fsum((x * x).tolist()), dtype  # few terms of few bits: the float64 sum is exact
        assert acc.result(dtype)["max_abs"] == float(np.max(np.abs(x))), dtype


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_native_kernel_equals_the_numpy_path_and_its_portable_loop(dtype: str) -> None:
    """The compiled kernel: the SIMD loop and the portable loop give the same bits; counts and max |x| equal numpy's.

    Hostile patterns at lengths around the 32-element lane groups and the block, and the same made finite (the
    vector loop's unmasked pass), with and without the Adam-epsilon threshold: every count and the largest pattern
    equal the numpy path's, the sum of squares equals the portable loop's bit for bit and is within 1e-13 of the
    correctly rounded sum (``math.fsum``) like the numpy path's.
    """
    nat = pytest.importorskip("_forensics_tensor_kernels", reason="the compiled kernel is not built (pip install .)")
    ml = pytest.importorskip("ml_dtypes")
    ftype = {"BF16": ml.bfloat16, "F16": np.float16, "F32": np.float32}[dtype]
    k = kernels.KINDS[dtype]
    block = tensors.BLOCK
    s = kernels.Scratch(block)
    cases = []
    for seed, n in enumerate((1, 7, 31, 32, 33, 64, 65, 1000, block - 1, block)):
        bits = _hostile_bits(dtype, n, seed=30 + seed) if n >= 8 else _hostile_bits(dtype, 8, seed)[-n:]
        cases += [bits, np.where((bits & k.mask) < k.inf, bits, 7).astype(bits.dtype)]  # and all finite
    for bits in cases:
        n = bits.shape[0]
        with np.errstate(invalid="ignore"):
            x = bits.view(ftype).astype(np.float64)
        fin = x[np.isfinite(x)]
        for small in (None, kernels.small_pattern(dtype, 1e-3)):
            arg = -1 if small is None else small
            simd, portable = (nat.reduce(bits, bits.itemsize, k.mask, k.inf, k.shift, arg, p) for p in (False, True))
            assert simd == portable or (math.isnan(simd[6]) and simd[:6] == portable[:6]), (dtype, n, nat.ISA)
            ref = kernels.Acc()
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(kernels, "_native", lambda: None)
                kernels.reduce_bits(dtype, bits.copy(), ref, s, small)
            top, n_zero, n_inf, n_nan, n_pos, n_small, sq = simd
            assert (top, n_zero, n_inf, n_nan) == (ref.top, ref.n_zero, ref.n_inf, ref.n_nan), (dtype, n)
            if small is not None:
                assert (n_pos, n_small) == (ref.n_pos, ref.n_small), (dtype, n)
            assert sq * k.scale == pytest.approx(math.fsum((fin * fin).tolist()), rel=1e-13, abs=0.0), (dtype, n)


@pytest.mark.skipif(not tensors._fork.AVAILABLE, reason="forked workers are Linux only")
def test_forked_workers_give_the_one_worker_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    sumsq_backend: str) -> None:
    """Ranges reduced by forked worker processes equal the one-worker result bit for bit, errors included.

    Every float dtype, with NaN/inf and finite, the Adam-epsilon count and the update norm, a tensor cut off
    by the end of the file (its error comes back from whichever process met it), a non-plain dtype beside them
    (kept in this process); ranges and reads smaller than the tensors, three processes.
    """
    block = tensors.BLOCK
    dtypes = ("F32", "BF16", "F16")
    data = {f"t{i}": (d, _hostile_bits(d, 3 * block + 5 + i, seed=60 + i)) for i, d in enumerate(dtypes)}
    data["clean"] = ("BF16", np.where((data["t1"][1] & 0x7FFF) < 0x7F80, data["t1"][1], 7).astype(np.uint16))
    data["ints"] = ("I32", np.arange(1000, dtype=np.int32))
    data["prev"] = ("F32", np.random.default_rng(3).standard_normal(3 * block + 6).astype(np.float32))
    path = tmp_path / "f.safetensors"
    _write_st(path, data)
    refs = sc.read(path).obj
    cut = sc.TensorRef(str(path), "cut", "F32", (path.stat().st_size,), refs["t0"].offset)  # ends beyond the file
    jobs = [(refs[k], 1e-3 if k != "ints" else None, None) for k in data] + [(refs["t1"], None, refs["prev"]),
                                                                             (cut, None, None)]
    monkeypatch.setattr(tensors, "TASK_BYTES", 2 * block * 4)
    monkeypatch.setattr(tensors, "READ_BYTES", block)
    got = {}
    for mode, workers, fork_bytes, batch in (("one", 1, 1 << 60, 1024), ("forked", 3, 0, 1024),
                                             ("batches", 3, 5 << 19, 3)):  # batches of 3, the short last in threads
        monkeypatch.setattr(tensors, "WORKERS", workers)
        monkeypatch.setattr(tensors, "FORK_BYTES", fork_bytes)
        monkeypatch.setattr(tensors._fork, "MAX_TASKS", batch)
        tensors._POOL.clear()
        got[mode] = [repr(st) if isinstance(st, Exception) else {k: repr(v) for k, v in st.items()}
                     for st in tensors.stats_many(jobs)]
    tensors._POOL.clear()
    assert got["forked"] == got["one"] and got["batches"] == got["one"]
    assert "truncated" in got["one"][-1] and "delta_sq" in got["one"][-2]


@pytest.mark.skipif(not tensors._fork.AVAILABLE, reason="forked workers are Linux only")
def test_forked_run_shares_tasks_and_survives_a_dead_worker() -> None:
    """Tasks are shared between the processes; a worker that dies takes no result with it (rerun here)."""
    import time

    from parsers import _tensor_fork as fork

    me = os.getpid()
    slow = [lambda: (time.sleep(0.02), os.getpid())[1] for _ in range(12)]
    pids = fork.run_forked(slow, lambda t: t(), 3)
    assert me in pids and len(set(pids)) >= 2
    dying = [(lambda i=i: i if os.getpid() == me else os._exit(3)) for i in range(20)]
    assert fork.run_forked(dying, lambda t: t(), 3) == list(range(20))


@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_tensor_stats_equal_numpy_reference_at_odd_sizes(dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         sumsq_backend: str) -> None:
    """Whole tensors through ``stats_many`` (2 workers, ranges and reads smaller than the tensors) against numpy.

    Zero-size, one-element and odd sizes around the block and range boundaries, each with NaN of both signs,
    +-inf, +-0, subnormals, huge and tiny values, and a tensor of zeros: counts and max_abs equal a plain
    float64 numpy computation, l2 within 1e-13 of the correctly rounded sum (``math.fsum``), and the result
    is the same bit for bit with one worker.
    """
    ml = pytest.importorskip("ml_dtypes")
    ftype = {"BF16": ml.bfloat16, "F16": np.float16, "F32": np.float32}[dtype]
    block = tensors.BLOCK
    monkeypatch.setattr(tensors, "TASK_BYTES", 2 * block * tensors.ITEMSIZE[dtype])
    monkeypatch.setattr(tensors, "READ_BYTES", block)
    sizes = (0, 1, 5, block - 1, block + 3, 4 * block + 777)
    data = {f"t{n}": (_hostile_bits(dtype, n, seed=n) if n >= 8 else _hostile_bits(dtype, 8, seed=n)[:n])
            for n in sizes}
    data["zeros"] = np.zeros(block + 1, dtype=data["t1"].dtype)
    path = tmp_path / "odd.safetensors"
    _write_st(path, {k: (dtype, v) for k, v in data.items()})
    refs = sc.read(path).obj
    got = {}
    for workers in (2, 1):
        monkeypatch.setattr(tensors, "WORKERS", workers)
        tensors._POOL.clear()
        got[workers] = tensors.stats_many([(refs[k], None, None) for k in data])
    tensors._POOL.clear()
    assert [{k: repr(v) for k, v in st.items()} for st in got[1]] == [{k: repr(v) for k, v in st.items()}
                                                                       for st in got[2]]  # NaN equals NaN here
    for (name, bits), st in zip(data.items(), got[2], strict=True):
        with np.errstate(invalid="ignore"):
            x = bits.view(ftype).astype(np.float64)
        fin = x[np.isfinite(x)]
        assert st["numel"] == x.size and st["n_nan"] == int(np.isnan(x).sum()), name
        assert st["n_inf"] == int(np.isinf(x).sum()) and st["n_zero"] == int((x == 0).sum()), name
        assert st["l2"] == pytest.approx(math.sqrt(math.fsum((fin * fin).tolist())), rel=1e-13, abs=0.0), name
        if fin.size:
            assert st["max_abs"] == float(np.max(np.abs(fin))), name
            assert st["rms"] == pytest.approx(st["l2"] / math.sqrt(fin.size), rel=1e-15), name
        else:  # nothing finite (the zero-size tensor): no magnitude to report
            assert math.isnan(st["max_abs"]) and math.isnan(st["rms"]) and st["l2"] == 0.0, name


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


def test_truncated_checkpoint_is_never_the_resume_point(tmp_path: Path) -> None:
    """A cut checkpoint is read as far as it goes, marked incomplete and never recommended for the resume.

    Its pairs give per-tensor update rows but no layer/model sums over the subset read; with no tensor read
    anywhere, the folder listing does not bring it back either.
    """
    import shutil

    from forensics.recovery import plan

    run, _ = _two_checkpoints(tmp_path)
    shutil.copytree(run / "ckpt" / "step_20", run / "ckpt" / "step_30")
    cut = run / "ckpt" / "step_20" / "model.safetensors"
    whole = sc.parse_header(cut)
    cut.write_bytes(cut.read_bytes()[:-100])
    lost = {r.name for r in whole.tensors if r.offset + r.nbytes > whole.file_bytes - 100}
    tensors, updates, meta, skipped = read_checkpoints(run, "run")
    by = {m["step"]: m for m in meta}
    assert by[10]["complete"] and by[30]["complete"] and "truncated" not in by[30]
    assert by[20]["complete"] is False and by[20]["truncated"] is True
    assert {s.what for s in skipped} == {f"ckpt/step_20/model.safetensors:{n}" for n in lost} | {
        "ckpt/step_20/model.safetensors"}
    assert tensors.filter(pl.col("step") == 20).height == 4 - len(lost) > 0
    pairs = {(r["step_from"], r["step_to"], r["tensor"]) for r in updates.iter_rows(named=True)}
    assert {(a, b) for a, b, _ in pairs} == {(10, 20), (10, 30)}  # step 30 is compared with the whole step 10
    assert (10, 30, "*") in pairs and not any(a == 10 and b == 20 and t.endswith("*") for a, b, t in pairs)

    def run_data(folder: Path, t: pl.DataFrame, m: list[dict]) -> RunData:
        rows = [{"run": "r", "segment": 0, "step": s, "metric": "loss", "value": 2.0, "wall_time": None,
                 "tag": "loss", "source": "m.jsonl"} for s in range(1, 400)]
        return RunData(run=str(folder), metrics=pl.DataFrame(rows), events=pl.DataFrame(), meta={"checkpoints": m},
                       sources=[], skipped=[], tensors=t)

    p = plan(run_data(run, tensors, meta), "update_scale_growth", "lr_too_high", 125)
    assert p is not None and p.resume_from["checkpoint"] == "ckpt/step_10", p.resume_from
    assert "step 20 is incomplete" in p.resume_from["why"]
    shutil.rmtree(run / "ckpt" / "step_10")
    shutil.rmtree(run / "ckpt" / "step_30")
    cut.write_bytes(cut.read_bytes()[: whole.tensors[0].offset + 4])  # not one tensor complete
    tensors, _, meta, _ = read_checkpoints(run, "run")
    assert tensors.height == 0 and meta[0]["truncated"] and not meta[0]["complete"]
    p = plan(run_data(run, tensors, meta), "update_scale_growth", "lr_too_high", 350)
    assert p is not None and p.resume_from["checkpoint"] is None, p.resume_from


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
    from forensics.detectors.checkpoint_state_mismatch import CheckpointStateMismatch
    from forensics.detectors.checkpoint_update_growth import CheckpointUpdateGrowth

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
    from forensics.detectors.checkpoint_update_growth import CheckpointUpdateGrowth

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


def test_stats_many_equals_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many tensors at once (pieces of all of them in one pool) give what tensor_stats gives one by one.

    Mixed dtypes and sizes (ranges of a large tensor, whole small ones, integers by the float path), an
    earlier tensor for the update norm, and a tensor the file's end cuts: that one is an error in its
    place, the others are unaffected.
    """
    monkeypatch.setattr(tensors, "TASK_BYTES", 2 * tensors.BLOCK)
    monkeypatch.setattr(tensors, "WORKERS", 2)
    monkeypatch.setattr(tensors, "IN_FLIGHT", 3)  # several windows of pieces
    tensors._POOL.clear()
    rng = np.random.default_rng(5)
    big = rng.standard_normal(6 * tensors.BLOCK + 5).astype(np.float32)
    path = tmp_path / "m.safetensors"
    _write_st(path, {"big": ("F32", big), "half": ("F16", big.astype(np.float16)), "ids": ("I64", np.arange(9)),
                     "small": ("F32", big[:100].copy()), "last": ("F32", big[:5000].copy())})
    refs = sc.read(path).obj
    cut = sc.TensorRef(str(path), "cut", "F32", (1 << 20,), refs["last"].offset)  # runs past the end of the file
    jobs = [(refs["big"], None, None), (refs["half"], 1e-3, refs["big"]), (cut, None, None), (refs["ids"], None, None),
            (refs["small"], 0.5, None), (refs["last"], None, refs["last"])]
    got = tensors.stats_many(jobs)
    assert isinstance(got[2], sc.CheckpointError) and "truncated" in str(got[2])
    for job, st in zip(jobs, got, strict=True):
        if job[0] is not cut:
            assert st == sc.tensor_stats(*job), job[0].name
    assert got[1]["delta_sq"] == pytest.approx(float(np.sum((big.astype(np.float16).astype(np.float64) - big) ** 2)),
                                               rel=1e-12)
    assert got[5]["delta_sq"] == 0.0
    tensors._POOL.clear()
