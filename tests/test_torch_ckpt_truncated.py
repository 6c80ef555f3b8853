"""A torch zip checkpoint cut short or with a damaged central directory keeps every complete tensor (issue 8).

Files are written by ``torch.save`` (torch 2.13: every member stored, flag 0x808, sizes in a 16-byte
``PK 07 08`` data descriptor after the data), then cut at every storage boundary plus and minus a few
bytes and at a random sample of offsets, or have bytes of their central directory flipped. The reader
(:func:`parsers.torch_ckpt.read`) must keep exactly the tensors whose storage bytes are all in the file,
with statistics equal to the intact file's, invent nothing, list every tensor it left out (key path,
file, the byte where the file ends) and flag the result truncated, so that it is never taken for a
checkpoint to resume from. Hand-made archives cover ZIP64 local headers and descriptors, sizes in the
local headers (other writers), absurd sizes and hostile pickles.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import struct
import tracemalloc
import zipfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from parsers import safetensors_ckpt as sc
from parsers import torch_ckpt as tc
from parsers.checkpoints import read_checkpoints

torch = pytest.importorskip("torch")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model state dict, an AdamW state dict after 3 steps, and a bundle with shared-storage views."""
    d = tmp_path_factory.mktemp("torch_saved")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 6)).pow(2).sum().backward()
        opt.step()
    torch.save(model.state_dict(), d / "model.pt")
    torch.save(opt.state_dict(), d / "optimizer.pt")
    w = model[0].weight.detach()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3,
                "views": [w.t(), w[1:3], torch.arange(5, dtype=torch.bfloat16)]}, d / "bundle.pt")
    return {p.stem: p for p in (d / "model.pt", d / "optimizer.pt", d / "bundle.pt")}


def _flat(obj: object, where: str = "") -> dict[str, sc.TensorRef]:
    """Every TensorRef by key path (``state.3.exp_avg``, ``views[1]``), as the reader names them."""
    out: dict[str, sc.TensorRef] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{where}.{k}" if where else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{where}[{i}]"))
    elif isinstance(obj, sc.TensorRef):
        out[where] = obj
    return out


def _stats(obj: object) -> dict[str, dict]:
    return {k: sc.tensor_stats(r) for k, r in _flat(obj).items()}


def _members(path: Path) -> dict[str, tuple[int, int]]:
    """Member name -> (first data byte, end of data) of an intact archive."""
    out = {}
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        for info in zf.infolist():
            fh.seek(info.header_offset)
            hdr = fh.read(30)
            nl, el = struct.unpack_from("<HH", hdr, 26)
            start = info.header_offset + 30 + nl + el
            out[info.filename] = (start, start + info.compress_size)
    return out


def _storage_end(ref: sc.TensorRef, members: dict[str, tuple[int, int]]) -> int:
    (end,) = [e for n, (s, e) in members.items() if "/data/" in n and s <= ref.offset < e]
    return end


def _cut_offsets(path: Path, rng: random.Random, sample: int = 60) -> list[int]:
    members = _members(path)
    size = path.stat().st_size
    marks = {size, min(s for s, _ in members.values()) - 30}
    for start, end in members.values():
        marks |= {start, end, end + 16}
    cuts = {m + d for m in marks for d in range(-3, 4)} | set(rng.sample(range(size), min(sample, size)))
    return sorted(c for c in cuts if 0 < c < size)


def test_what_torch_writes(saved: dict[str, Path]) -> None:
    """Torch 2.13 writes stored members, flag 0x808, CRC and sizes 0 in the local header, a 16-byte descriptor."""
    data = saved["model"].read_bytes()
    members = _members(saved["model"])
    pos = 0
    with zipfile.ZipFile(saved["model"]) as zf:
        infos = {i.filename: i for i in zf.infolist()}
    assert next(iter(infos)).endswith("/data.pkl")  # written first
    while data[pos:pos + 4] == b"PK\x03\x04":
        flag, method, crc, csz, usz, nl, el = struct.unpack_from("<2xHH4xIIIHH", data, pos + 4)
        name = data[pos + 30:pos + 30 + nl].decode()
        extra = data[pos + 30 + nl:pos + 30 + nl + el]
        assert (flag, method, crc, csz, usz) == (0x808, 0, 0, 0, 0), name
        assert extra[:2] == b"FB" and members[name][0] % 64 == 0, name  # alignment padding in the FB extra field
        end = members[name][1]
        sig, dcrc, dcsz, dusz = struct.unpack_from("<4sIII", data, end)
        assert (sig, dcrc, dcsz, dusz) == (b"PK\x07\x08", infos[name].CRC, infos[name].file_size,
                                          infos[name].file_size), name
        pos = end + 16
    assert data[pos:pos + 4] == b"PK\x01\x02"


@pytest.mark.parametrize("which", ["model", "optimizer", "bundle"])
def test_cut_keeps_exactly_the_complete_tensors(saved: dict[str, Path], which: str, tmp_path: Path) -> None:
    """Cut at every storage boundary +-3 bytes and at random: the complete tensors, equal, the rest listed."""
    src = saved[which]
    data = src.read_bytes()
    intact = tc.read(src)
    assert intact.complete and not intact.skipped
    full = _stats(intact.obj)
    refs = _flat(intact.obj)
    members = _members(src)
    pkl_end = next(e for n, (_, e) in members.items() if n.endswith("/data.pkl"))
    ends = {k: _storage_end(r, members) for k, r in refs.items()}
    path = tmp_path / src.name
    n_partial = 0
    for cut in _cut_offsets(src, random.Random(8)):
        path.write_bytes(data[:cut])
        if cut < pkl_end:
            with pytest.raises(sc.CheckpointError, match=r"incomplete save: (data\.pkl is cut|the file ends at byte "
                                                         rf"{cut} before data\.pkl)"):
                tc.read(path)
            continue
        got = tc.read(path)
        assert got.truncated and got.salvaged and not got.complete and got.size == cut, cut
        kept = _stats(got.obj)
        want = {k for k, e in ends.items() if e <= cut}
        assert set(kept) == want, (cut, set(kept) ^ want)
        assert all(kept[k] == full[k] for k in kept), cut
        head, *lost = got.skipped
        assert head.what == f"{path}:{cut}" and "incomplete save" in head.reason and f"byte {cut}" in head.reason
        assert f"{len(want)} of {len(refs)} tensors read" in head.reason
        named = {s.reason.split()[1] for s in lost}
        assert named == set(refs) - want, cut
        assert all(s.what == f"{path}:{cut}" and f"byte {cut}" in s.reason for s in lost), lost[:2]
        n_partial += 0 < len(want) < len(refs)
        with pytest.raises(sc.CheckpointError, match="incomplete save"):
            tc.load(path)
    assert n_partial >= 10


def test_cut_optimizer_names_state_keys(saved: dict[str, Path], tmp_path: Path) -> None:
    """A tensor left out is named by its key path (``state.3.exp_avg``), the storage and where the file ends."""
    src = saved["optimizer"]
    members = _members(src)
    refs = _flat(tc.read(src).obj)
    cut = _storage_end(refs["state.3.exp_avg"], members) - 5
    path = tmp_path / "optimizer.pt"
    path.write_bytes(src.read_bytes()[:cut])
    got = tc.read(path)
    reasons = {s.reason.split()[1]: s.reason for s in got.skipped[1:]}
    assert "state.3.exp_avg" in reasons and "state.3.exp_avg_sq" in reasons and "state.3.step" not in reasons
    why = reasons["state.3.exp_avg"]
    assert "storage data/10 is cut: it needs bytes" in why and f"ends at byte {cut}" in why
    assert "missing: the file ends at byte" in reasons["state.3.exp_avg_sq"]
    c = tc.classify(got.obj)
    (opt,) = c.optimizers
    assert set(opt["state"][3]) == {"step"} and set(opt["state"][2]) == {"step", "exp_avg", "exp_avg_sq"}
    assert opt["param_groups"][0]["lr"] == 1e-3


def test_cut_bundle_list_slot_and_shared_storage(saved: dict[str, Path], tmp_path: Path) -> None:
    """Two views of one storage go together; a list keeps its length (a left-out slot is None)."""
    src = saved["bundle"]
    members = _members(src)
    refs = _flat(tc.read(src).obj)
    last = max(members[n][1] for n in members if "/data/" in n)
    path = tmp_path / "bundle.pt"
    path.write_bytes(src.read_bytes()[:last - 1])
    got = tc.read(path)
    views = got.obj["views"]
    assert len(views) == 3 and views[2] is None and views[0] is not None and views[1] is not None
    assert _storage_end(refs["views[0]"], members) == _storage_end(refs["views[1]"], members)
    assert got.obj["step"] == 3


@pytest.mark.parametrize("which", ["model", "optimizer"])
def test_flipped_central_directory_keeps_everything(saved: dict[str, Path], which: str, tmp_path: Path) -> None:
    """Every byte of the central directory and end record flipped: all tensors kept, equal; damage flagged."""
    src = saved[which]
    data = src.read_bytes()
    full = _stats(tc.read(src).obj)
    cd = data.index(b"PK\x01\x02")
    sigs = {i + k for i in range(cd, len(data)) if data[i:i + 4] in (b"PK\x01\x02", b"PK\x05\x06") for k in range(4)}
    path = tmp_path / src.name
    salvaged = 0
    for pos in range(cd, len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0xFF
        path.write_bytes(bad)
        got = tc.read(path)
        assert _stats(got.obj) == full, pos
        if pos in sigs:
            assert got.salvaged and got.skipped, pos
        if got.salvaged:
            salvaged += 1
            assert got.skipped[0].what.startswith(f"{path}:")
            with pytest.raises(sc.CheckpointError):
                tc.load(path)
    assert salvaged >= len(sigs)


def test_flipped_data_pkl_is_refused_as_corrupt(saved: dict[str, Path], tmp_path: Path) -> None:
    """A flipped byte inside data.pkl of an intact file fails its CRC-32: refused as corrupt, not as cut."""
    src = saved["optimizer"]
    start, end = next(v for n, v in _members(src).items() if n.endswith("/data.pkl"))
    path = tmp_path / src.name
    for pos in (start, (start + end) // 2, end - 1):
        bad = bytearray(src.read_bytes())
        bad[pos] ^= 0x20
        path.write_bytes(bad)
        with pytest.raises(sc.CheckpointError, match=r"corrupt: .*data\.pkl does not match its CRC-32"):
            tc.read(path)


def test_run_folder_flags_the_cut_checkpoint(saved: dict[str, Path], tmp_path: Path) -> None:
    """read_checkpoints keeps the complete tensors of a cut file and marks its checkpoint incomplete and truncated."""
    from forensics.recovery import _finite_checkpoints

    run = tmp_path / "run"
    for step in (10, 20):
        d = run / "ckpt" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(saved["model"].read_bytes())
        (d / "optimizer.pt").write_bytes(saved["optimizer"].read_bytes())
    refs = _flat(tc.read(saved["optimizer"]).obj)
    cut = _storage_end(refs["state.2.exp_avg"], _members(saved["optimizer"])) + 3
    bad = run / "ckpt" / "step_20" / "optimizer.pt"
    bad.write_bytes(saved["optimizer"].read_bytes()[:cut])
    tensors, _updates, meta, skipped = read_checkpoints(run, "run")
    by_step = {m["step"]: m for m in meta}
    assert by_step[10]["complete"] is True and "truncated" not in by_step[10]
    assert by_step[20]["complete"] is False and by_step[20]["truncated"] is True
    assert any("incomplete save" in p for p in by_step[20]["problems"])
    mine = [s for s in skipped if s.what.startswith("ckpt/step_20/optimizer.pt")]
    assert mine and all(s.what == f"ckpt/step_20/optimizer.pt:{cut}" for s in mine)
    assert any("state.2.exp_avg_sq not read" in s.reason for s in mine)
    t10 = tensors.filter(tensors["step"] == 10)
    t20 = tensors.filter(tensors["step"] == 20)
    assert 0 < t20.height < t10.height
    rows10 = {(r["tensor"], r["role"]): r for r in t10.iter_rows(named=True)}
    for r in t20.iter_rows(named=True):  # everything kept from the cut file equals the intact copy
        assert {k: v for k, v in r.items() if k not in ("step", "checkpoint")} == \
            {k: v for k, v in rows10[r["tensor"], r["role"]].items() if k not in ("step", "checkpoint")}
    ok, _note = _finite_checkpoints(SimpleNamespace(meta={"checkpoints": meta}, tensors=tensors), 1000)
    assert [s for s, _ in ok] == [10]  # never a resume candidate


def test_cut_data_pkl_is_refused_cleanly(saved: dict[str, Path], tmp_path: Path) -> None:
    """data.pkl cut: one Skip with a clear message, no tensor, no traceback."""
    run = tmp_path / "run" / "ckpt" / "step_5"
    run.mkdir(parents=True)
    (run / "optimizer.pt").write_bytes(saved["optimizer"].read_bytes()[:300])
    tensors, _, meta, skipped = read_checkpoints(tmp_path / "run", "run")
    assert tensors.height == 0 and meta[0]["complete"] is False
    (s,) = skipped
    assert s.what == "ckpt/step_5/optimizer.pt" and s.reason.startswith("incomplete save: data.pkl is cut")
    assert "Traceback" not in s.reason


def test_hostile_pickle_refused_in_a_cut_file(tmp_path: Path) -> None:
    """A cut file whose data.pkl wants os.system is refused by the walk too; nothing runs."""
    marker = tmp_path / "pwned"
    src = tmp_path / "evil_src.pt"
    torch.save({"w": torch.ones(3), "x": _Evil(marker)}, src)
    data = src.read_bytes()
    path = tmp_path / "evil.pt"
    for cut in (data.index(b"PK\x01\x02"), data.index(b"PK\x01\x02") - 7, len(data) - 3):
        path.write_bytes(data[:cut])
        with pytest.raises(sc.CheckpointError, match=r"refused: pickle wants to import (os|posix)\.system"):
            tc.read(path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # sizes in the local headers (Python's writer), no descriptor
        zf.writestr("evil/data.pkl", pickle.dumps(_Evil(marker), protocol=2))
    raw = buf.getvalue()
    path.write_bytes(raw[:raw.index(b"PK\x01\x02")])
    with pytest.raises(sc.CheckpointError, match="refused"):
        tc.read(path)
    assert not marker.exists()


def _local(name: bytes, flag: int, csz: int, usz: int, extra: bytes = b"", crc: int = 0) -> bytes:
    return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 45, flag, 0, 0, 0, crc, csz, usz, len(name), len(extra)) \
        + name + extra


def _rewrite(src: Path, style: str) -> bytes:
    """The members of ``src`` rewritten without a central directory, in one of four local-header styles.

    ``miniz64``: what torch 2.13 writes for a member of 4 GiB or more (measured on a 4 GiB save: sizes 0,
    a ZIP64 extra field holding the uncompressed size and 0, a 24-byte descriptor with 64-bit sizes);
    ``miniz64_offset``: for a member starting past 4 GiB (the extra field holds the header offset);
    ``zip64``: sizes 0xFFFFFFFF in the header and the real ones in its ZIP64 extra field, no descriptor;
    ``sized``: sizes in the header (Python's zipfile).
    """
    out = bytearray()
    with zipfile.ZipFile(src) as zf:
        for info in zf.infolist():
            body = zf.read(info)
            name, crc = info.filename.encode(), zlib.crc32(body)
            if style in ("miniz64", "miniz64_offset"):
                z64 = struct.pack("<HHQQ", 1, 16, len(body), 0) if style == "miniz64" else \
                    struct.pack("<HHQ", 1, 8, (1 << 32) + len(out))
                out += _local(name, 0x808, 0, 0, z64 + b"FB\x02\x00ZZ") + body
                out += struct.pack("<4sIQQ", b"PK\x07\x08", crc, len(body), len(body))
            elif style == "zip64":
                out += _local(name, 0x800, 0xFFFFFFFF, 0xFFFFFFFF, struct.pack("<HHQQ", 1, 16, len(body), len(body)),
                              crc) + body
            else:
                out += _local(name, 0x800, len(body), len(body), b"", crc) + body
    return bytes(out)


@pytest.mark.parametrize("style", ["miniz64", "miniz64_offset", "zip64", "sized"])
def test_zip64_and_sized_local_headers(saved: dict[str, Path], style: str, tmp_path: Path) -> None:
    """ZIP64 extra fields and 24-byte descriptors, or sizes in the local headers: the same tensors, equal."""
    src = saved["optimizer"]
    full = _stats(tc.read(src).obj)
    data = _rewrite(src, style)
    path = tmp_path / "optimizer.pt"
    path.write_bytes(data)
    got = tc.read(path)
    assert got.truncated and _stats(got.obj) == full
    assert len(got.skipped) == 1 and "18 of 18 tensors read" in got.skipped[0].reason
    stored = sorted(_flat(got.obj).values(), key=lambda r: r.offset)
    cut = stored[len(stored) // 2].offset + 1
    path.write_bytes(data[:cut])
    part = _stats(tc.read(path).obj)
    assert part and set(part) < set(full) and all(part[k] == full[k] for k in part)


def test_absurd_local_sizes_allocate_nothing_big(saved: dict[str, Path], tmp_path: Path) -> None:
    """Sizes of 2 GiB to 2**62 in local headers (or no descriptor at all): a Skip or a refusal, small memory."""
    pkl_name = b"a/data.pkl"
    src = saved["optimizer"].read_bytes()
    members = _members(saved["optimizer"])
    s0 = min(s for n, (s, _) in members.items() if "/data/" in n)
    hdr0 = src.rfind(b"PK\x03\x04", 0, s0)
    huge_storage = bytearray(src[:hdr0])  # data.pkl intact, then data/0 claims 2 GiB without a descriptor
    huge_storage += src[hdr0:hdr0 + 6] + struct.pack("<H", 0x800) + src[hdr0 + 8:hdr0 + 18] \
        + struct.pack("<II", 0x7FFFFFFF, 0x7FFFFFFF) + src[hdr0 + 26:s0 + 64]
    cases = {
        "pickle 4 GiB": _local(pkl_name, 0x800, 0xFFFFFFF0, 0xFFFFFFF0) + b"\x80\x02}q\x00." * 10,
        "pickle 2**62 zip64": _local(pkl_name, 0x800, 0xFFFFFFFF, 0xFFFFFFFF, struct.pack("<HHQQ", 1, 16, 1 << 62,
                                                                                          1 << 62)) + b"x" * 100,
        "no descriptor in 3 MB": _local(pkl_name, 0x808, 0, 0) + random.Random(1).randbytes(3 << 20),
        "name and extra past the end": struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 5, 5,
                                                   65535, 65535) + b"a",
        "storage 2 GiB": bytes(huge_storage),
    }
    path = tmp_path / "bad.pt"
    for label, data in cases.items():
        path.write_bytes(data)
        tracemalloc.start()
        try:
            got = tc.read(path)
        except sc.CheckpointError as exc:
            assert "Traceback" not in str(exc)
            got = None
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < (3 << 20) + (8 << 20), (label, peak)
        if label == "storage 2 GiB":
            assert got is not None and got.truncated
            lost = [s.reason for s in got.skipped[1:]]
            assert any("storage data/0 is cut" in r for r in lost) and not _flat(got.obj)
        elif label != "no descriptor in 3 MB":
            assert got is None, label
