"""Hostile and damaged checkpoints (issue 8).

Pickles that must run nothing, refused safetensors headers, cut files that keep exactly their complete
tensors, fuzzing of both readers.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import struct
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as hs
from robustness_helpers import (
    FIGURES,
    SAMPLES,
    _fuzz,
    _offsets,
)

from parsers import safetensors_ckpt as sc
from parsers import torch_ckpt as tc

# -- checkpoints -------------------------------------------------------------------------------------------


class _Evil:
    def __init__(self, fn, args) -> None:  # noqa: ANN001
        self.fn, self.args = fn, args

    def __reduce__(self):  # noqa: ANN204
        return self.fn, self.args


def _evil_pt(path: Path, payload: object) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"model": payload}, protocol=2))
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")


def test_hostile_pickles_run_nothing(tmp_path: Path) -> None:
    """Pickles reducing to os.system, exec, eval, Popen, popen are refused; nothing runs."""
    import builtins
    import subprocess

    from parsers.checkpoints import read_checkpoints

    marker = tmp_path / "pwned"
    cmd = f"touch {marker}"
    payloads = {
        "os.system": _Evil(os.system, (cmd,)),
        "builtins.exec": _Evil(builtins.exec, (f"open({str(marker)!r}, 'w').close()",)),
        "builtins.eval": _Evil(builtins.eval, (f"open({str(marker)!r}, 'w')",)),
        "subprocess.Popen": _Evil(subprocess.Popen, (["touch", str(marker)],)),
        "os.popen": _Evil(os.popen, (cmd,)),
    }
    ck = tmp_path / "run" / "ckpt" / "step_10"
    ck.mkdir(parents=True)
    for label, obj in payloads.items():
        path = ck / f"{label.replace('.', '_')}.pt"
        _evil_pt(path, obj)
        with pytest.raises(sc.CheckpointError, match="refused"):
            tc.load(path)
        assert not marker.exists(), label
    _, _, info, skipped = _read_ckpts(read_checkpoints, tmp_path / "run")
    assert not marker.exists()
    refused = [s for s in skipped if "refused" in s.reason]
    assert len(refused) == len(payloads), skipped


def _read_ckpts(fn, run: Path):  # noqa: ANN001, ANN202
    out = fn(run, "run")
    tensors, updates, info = out[0], out[1], out[2]
    skipped = out[3] if len(out) > 3 else info
    return tensors, updates, info, skipped


def _safetensors(tensors: dict[str, tuple[str, list[int], list[int]]], buf: bytes, extra: bytes = b"") -> bytes:
    head = json.dumps({k: {"dtype": d, "shape": s, "data_offsets": o} for k, (d, s, o) in tensors.items()}).encode()
    return struct.pack("<Q", len(head)) + head + extra + buf


def test_hostile_safetensors_refused(tmp_path: Path) -> None:
    """Out-of-range offsets no truncation explains and absurd header sizes are refused without a big allocation.

    Offsets past the end that a cut explains (the tensors tile the buffer from 0, the file is shorter) are
    read as a truncated file: the cut tensor is listed, nothing is allocated for it.
    """
    import tracemalloc

    path = tmp_path / "model.safetensors"
    buf = b"\x00" * 16
    hostile = {
        "begin past end": _safetensors({"w": ("F32", [0], [40, 40])}, buf),
        "hole then past end": _safetensors({"a": ("F32", [2], [0, 8]), "b": ("F32", [4], [16, 32])}, buf),
        "gap at start": _safetensors({"w": ("F32", [8], [8, 40])}, buf),
        "negative": _safetensors({"w": ("F32", [1], [-4, 0])}, buf),
        "reversed": _safetensors({"w": ("F32", [1], [8, 4])}, buf),
        "huge size mismatch": _safetensors({"w": ("F32", [4], [0, 1 << 42])}, buf),
        "shape overflow": _safetensors({"w": ("F32", [1 << 62, 1 << 62], [0, 16])}, buf),
        "size mismatch": _safetensors({"w": ("F32", [3], [0, 16])}, buf),
        "overlap": _safetensors({"a": ("F32", [2], [0, 8]), "b": ("F32", [2], [4, 12])}, buf),
        "overlap past end": _safetensors({"a": ("F32", [4], [0, 16]), "b": ("F32", [4], [8, 24])}, buf),
        "float offsets": _safetensors({"w": ("F32", [4], [0.0, 16.0])}, buf),
        "header 2^63": struct.pack("<Q", 1 << 63) + b"{}",
        "header 2^64-1": struct.pack("<Q", (1 << 64) - 1) + b"{}",
        "header past end": struct.pack("<Q", 1000) + b"{}",
        "header 99MB past end": struct.pack("<Q", 99_000_000) + b"{}",
        "not json": struct.pack("<Q", 4) + b"{abc",
        "not utf-8": struct.pack("<Q", 4) + b"{\xff\xfe}",
        "short": b"\x01\x02",
    }
    cut = {  # read as truncated: (tensors kept, tensors cut)
        "end past buffer": (_safetensors({"w": ("F32", [8], [0, 32])}, buf), [], ["w"]),
        "huge offset": (_safetensors({"w": ("F32", [1 << 40], [0, 1 << 42])}, buf), [], ["w"]),
        "second cut": (_safetensors({"a": ("F32", [2], [0, 8]), "b": ("F32", [4], [8, 24])}, buf), ["a"], ["b"]),
        "empty past end": (_safetensors({"a": ("F32", [4], [0, 16]), "b": ("F32", [4], [16, 32]),
                                         "e": ("F32", [0], [32, 32])}, buf), ["a"], ["b", "e"]),
    }
    for label, data in [*hostile.items(), *((k, v[0]) for k, v in cut.items())]:
        path.write_bytes(data)
        FIGURES[("parsers.safetensors_ckpt", "inputs")] += 1
        tracemalloc.start()
        if label in hostile:
            with pytest.raises(sc.CheckpointError):
                sc.read_header(path)
        else:
            h = sc.parse_header(path)
            kept, lost = cut[label][1:]
            assert h.truncated and [r.name for r in h.tensors] == kept and list(h.cut) == lost, label
            assert all(sc.tensor_stats(r)["numel"] == r.numel > 0 for r in h.tensors)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 << 20, (label, peak)


def _ckpt_files() -> list[Path]:
    d = SAMPLES / "ckpt_nonfinite_state" / "ckpt" / "step_100"
    return [d / "model.safetensors", d / "scheduler.pt", d / "optimizer.pt"]


def _ckpt_read_counted(mod_name: str, path: Path) -> None:
    """Read a checkpoint, counting the input and any crash (only CheckpointError may escape)."""
    FIGURES[(mod_name, "inputs")] += 1
    try:
        _ckpt_read(path)
    except sc.CheckpointError:
        pass
    except Exception:
        FIGURES[(mod_name, "crashes")] += 1
        raise


def _ckpt_read(path: Path) -> list:
    """Everything the checkpoint readers give for one file: tensor statistics, or raise CheckpointError."""
    if path.suffix == ".safetensors":
        refs, _, _ = sc.read_header(path)
    else:
        c = tc.classify(tc.read(path).obj)  # a cut or damaged torch file keeps its complete tensors
        refs = [r for _, r in c.params + c.other] + [r for o in c.optimizers for _, _, r in tc.optimizer_tensors(o)]
    return [sc.tensor_stats(r) for r in refs]


@pytest.mark.parametrize("src", _ckpt_files(), ids=lambda p: p.name)
def test_damaged_checkpoints(src: Path, tmp_path: Path) -> None:
    """Cut, flipped, padded: only CheckpointError escapes; an undamaged prefix is never misread."""
    mod_name = "parsers.safetensors_ckpt" if src.suffix == ".safetensors" else "parsers.torch_ckpt"
    data = src.read_bytes()
    path = tmp_path / src.name
    rng = random.Random(6)
    damaged = [data[:k] for k in _offsets(len(data), rng, dense=150)]
    for pos in rng.sample(range(len(data)), 150):
        bad = bytearray(data)
        bad[pos] ^= 0xFF
        damaged.append(bytes(bad))
    damaged += [data + b"\x00" * 100, b"junk" + data, b"", gzip.compress(data)]
    for bad in damaged:
        path.write_bytes(bad)
        _ckpt_read_counted(mod_name, path)


def _torch_refs(obj: object, where: str = "") -> dict[str, sc.TensorRef]:
    out: dict[str, sc.TensorRef] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_torch_refs(v, f"{where}.{k}" if where else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_torch_refs(v, f"{where}[{i}]"))
    elif isinstance(obj, sc.TensorRef):
        out[where] = obj
    return out


def test_cut_torch_checkpoint_keeps_complete_tensors(tmp_path: Path) -> None:
    """A cut .pt keeps every tensor whose storage is whole, equal to the intact file's; the rest listed."""
    src = _ckpt_files()[2]
    data = src.read_bytes()
    full = {k: sc.tensor_stats(r) for k, r in _torch_refs(tc.read(src).obj).items()}
    path = tmp_path / src.name
    rng = random.Random(7)
    kept_some = 0
    for cut in _offsets(len(data), rng, dense=60):
        path.write_bytes(data[:cut])
        FIGURES[("parsers.torch_ckpt", "inputs")] += 1
        try:
            got = tc.read(path)
        except sc.CheckpointError as exc:
            assert "data.pkl" in str(exc) or cut < 4, (cut, exc)  # only a cut data.pkl refuses the file
            continue
        kept = {k: sc.tensor_stats(r) for k, r in _torch_refs(got.obj).items()}
        assert set(kept) <= set(full) and all(kept[k] == full[k] for k in kept), cut
        lost = set(full) - set(kept)
        assert cut == len(data) or (got.truncated and f"{path}:{cut}" == got.skipped[0].what), cut
        assert len(got.skipped) == (0 if cut == len(data) else 1 + len(lost)), cut
        kept_some += bool(kept)
    assert kept_some


@pytest.mark.parametrize("mod_name", ["parsers.safetensors_ckpt", "parsers.torch_ckpt"])
def test_fuzz_checkpoints(mod_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random bytes as checkpoints: only CheckpointError escapes."""
    folder = tmp_path_factory.mktemp("ck")
    head = b"PK\x03\x04" if mod_name == "parsers.torch_ckpt" else b""
    name = "model.pt" if mod_name == "parsers.torch_ckpt" else "model.safetensors"

    @_fuzz
    @given(hs.binary(max_size=400), hs.booleans())
    def run(data: bytes, hdr: bool) -> None:
        if mod_name == "parsers.safetensors_ckpt" and hdr:
            data = struct.pack("<Q", len(data)) + data
        path = folder / name
        path.write_bytes((head if hdr else b"") + data)
        _ckpt_read_counted(mod_name, path)

    run()


