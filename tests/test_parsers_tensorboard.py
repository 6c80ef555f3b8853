"""parsers.tensorboard: real SummaryWriter files, EventAccumulator cross-checks, damage, crafted encodings."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from forensics.errors import ParseError
from parsers import tensorboard as tb

# ------------------------------------------------ a tiny protobuf/TFRecord encoder (tests only)


def _vint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _ld(fn: int, data: bytes) -> bytes:
    return _vint(fn << 3 | 2) + _vint(len(data)) + data


def _vi(fn: int, v: int) -> bytes:
    return _vint(fn << 3) + _vint(v)


def _event(step: int, summary: bytes = b"", wall: float = 1.7e9, extra: bytes = b"") -> bytes:
    body = _vint(1 << 3 | 1) + struct.pack("<d", wall) + (_vi(2, step) if step else b"")
    return body + (_ld(5, summary) if summary else b"") + extra


def _value(tag: str, simple: float | None = None, tensor: bytes | None = None,
           plugin: str | None = None) -> bytes:
    v = _ld(1, tag.encode())
    if simple is not None:
        v += _vint(2 << 3 | 5) + struct.pack("<f", simple)
    if tensor is not None:
        v += _ld(8, tensor)
    if plugin is not None:
        v += _ld(9, _ld(1, _ld(1, plugin.encode())))
    return _ld(1, v)


def _record(payload: bytes) -> bytes:
    head = struct.pack("<Q", len(payload))
    crc = struct.pack("<I", tb.masked_crc32c(head)), struct.pack("<I", tb.masked_crc32c(payload))
    return head + crc[0] + payload + crc[1]


def _write(path: Path, payloads: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(_record(p) for p in [_ld(3, b"brain.Event:2"), *payloads]))
    return path


def _frames(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte span of every record of a clean file."""
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, pos + 16 + n))
        pos += 16 + n
    return out


def _rows(res) -> list[tuple[str, int, float]]:
    t = res.metrics
    return list(zip(t.column("tag").to_pylist(), t.column("step").to_pylist(), t.column("value").to_pylist(),
                    strict=True))


@pytest.fixture(autouse=True, params=["python", "compiled"])
def decoder(request, monkeypatch) -> str:
    """Every test here runs with the Python walk and with the vectorised windows (parsers/_tfrecord.py)."""
    size = 0 if request.param == "compiled" else 1 << 62
    monkeypatch.setattr(tb, "FAST_MIN_BYTES", size)
    return request.param


# ------------------------------------------------ real writer fixture


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """A run folder written by torch's SummaryWriter with every scalar encoding, histograms, text, hparams."""
    torch = pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter

    d = tmp_path_factory.mktemp("tbrun")
    w = SummaryWriter(str(d))
    for s in range(40):
        x = 1.0 / (s + 1) + 0.1
        w.add_scalar("train/loss", x, s)
        w.add_scalar("lr", 1e-3 * 0.97 ** s, s, new_style=True)
        w.add_scalar("grad_norm", x * 3.0, s, new_style=True, double_precision=True)
        if s % 10 == 0:
            w.add_histogram("weights", torch.arange(10, dtype=torch.float32) * s, s)
            w.add_text("note", f"step {s}", s)
    w.add_hparams({"lr": 1e-3, "optimizer": "adamw", "layers": 4, "amp": True}, {"hp/final_loss": 0.2})
    w.close()
    return d


def _main_file(d: Path) -> Path:
    return next(p for p in sorted(d.glob("events.out.tfevents.*")))


def test_sniff(tmp_path):
    """Event files are recognised by name."""
    assert tb.sniff(tmp_path / "events.out.tfevents.1700000000.host.1.0")
    assert not tb.sniff(tmp_path / "metrics.jsonl")


def test_reads_every_scalar_encoding(real_run):
    """simple_value, new_style float and double scalars are all read, with their precision."""
    res = tb.read(_main_file(real_run), real_run)
    t = res.metrics
    assert t.num_rows == 120 and res.skipped == ()
    by = {(r[0], r[1]): r[2] for r in _rows(res)}
    assert by[("train/loss", 3)] == float(np.float32(1.0 / 4 + 0.1))  # simple_value: float32
    assert by[("lr", 5)] == float(np.float32(1e-3 * 0.97 ** 5))  # new_style DT_FLOAT
    assert by[("grad_norm", 7)] == (1.0 / 8 + 0.1) * 3.0  # new_style double: exact
    assert set(t.column("metric").to_pylist()) == {"loss", "lr", "grad_norm"}
    assert set(t.column("segment").to_pylist()) == {0}
    assert all(w > 1.5e9 for w in t.column("wall_time").to_pylist())
    assert res.meta["encodings"] == {"train/loss": "simple_value", "lr": "DT_FLOAT", "grad_norm": "DT_DOUBLE"}
    assert res.meta["non_scalar"] == {"histogram": 4, "text": 4}
    assert res.meta["file_version"] == "brain.Event:2"
    assert res.precision == "float32"


def test_hparams_side_file(real_run):
    """add_hparams' side file yields the hyper-parameters and its metric."""
    side = next(p for p in real_run.rglob("events.out.tfevents.*") if p.parent != real_run)
    res = tb.read(side, real_run)
    assert res.meta["hparams"] == {"lr": 1e-3, "optimizer": "adamw", "layers": 4.0, "amp": 1.0}
    assert _rows(res) == [("hp/final_loss", 0, float(np.float32(0.2)))]


def test_matches_event_accumulator(real_run):
    """Same (tag, step, value) set as tensorboard's EventAccumulator keeping everything."""
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    path = _main_file(real_run)
    acc = ea_mod.EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    theirs = {(t, e.step, e.value) for t in acc.Tags()["scalars"] for e in acc.Scalars(t)}
    for t in acc.Tags()["tensors"]:
        from tensorboard.util import tensor_util

        for e in acc.Tensors(t):
            arr = tensor_util.make_ndarray(e.tensor_proto)
            if arr.size == 1 and arr.dtype.kind == "f":
                theirs.add((t, e.step, float(arr.reshape(()))))
    ours = set(_rows(tb.read(path, real_run)))
    assert ours == theirs


@pytest.fixture(params=["torch", "crafted"])
def event_file(request, tmp_path_factory) -> Path:
    """The SummaryWriter file (skipped without torch), or a crafted file with every encoding."""
    if request.param == "torch":
        return _main_file(request.getfixturevalue("real_run"))
    d = tmp_path_factory.mktemp("crafted")
    f32 = lambda x: _vi(1, 1) + _ld(2, b"") + _ld(4, struct.pack("<f", x))  # noqa: E731
    f64 = lambda x: _vi(1, 2) + _ld(2, b"") + _ld(6, struct.pack("<d", x))  # noqa: E731
    ev = []
    for s in range(1, 30):
        ev += [_event(s, _value("loss", simple=1.0 / s)),
               _event(s, _value("lr", tensor=f32(s * 1e-4), plugin="scalars")),
               _event(s, _value("gnorm", tensor=f64(s / 3)))]
    return _write(d / "events.out.tfevents.crafted", ev)


def test_truncated_at_every_offset(event_file, tmp_path):
    """A file cut anywhere keeps every complete record and reports the cut offset."""
    data = event_file.read_bytes()
    spans = _frames(data)
    root = tmp_path
    res = tb.read(event_file, event_file.parent)
    full = _rows(res)
    # every record is read: one row per record except the file_version one and the non-scalar ones
    assert res.meta["records"] == len(spans)
    assert len(full) == len(spans) - 1 - sum(res.meta["non_scalar"].values())
    # rows read from each clean prefix (ending at a record boundary)
    clean = {}
    for _, end in spans:
        p = root / "events.out.tfevents.clean"
        p.write_bytes(data[:end])
        clean[end] = _rows(tb.read(p, root))
    assert clean[len(data)] == full
    p = root / "events.out.tfevents.cut"
    # every offset of the first records, and around every header/CRC boundary of the others
    cuts = set(range(1, min(len(data), spans[3][1]))) | set(range(1, len(data), 97))
    for s, e in spans:
        cuts |= {s + d for d in (1, 7, 8, 11, 12, 13)} | {e - 5, e - 4, e - 3, e - 1}
    for cut in sorted(c for c in cuts if 0 < c < len(data)):
        p.write_bytes(data[:cut])
        res = tb.read(p, root)
        boundary = max((e for _, e in spans if e <= cut), default=0)
        if boundary == 0:
            assert res.metrics.num_rows == 0
        else:
            assert _rows(res) == clean[boundary], cut
        if cut != boundary:
            assert [s.what for s in res.skipped] == [f"events.out.tfevents.cut:{boundary}"], cut
            assert "truncated" in res.skipped[0].reason


def test_truncated_matches_event_accumulator(real_run, tmp_path):
    """On a tail cut 7 bytes short, same events as EventAccumulator."""
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    data = _main_file(real_run).read_bytes()
    p = tmp_path / "events.out.tfevents.cut"
    p.write_bytes(data[:-7])
    acc = ea_mod.EventAccumulator(str(p), size_guidance={"scalars": 0})
    acc.Reload()
    theirs = {(t, e.step) for t in acc.Tags()["scalars"] for e in acc.Scalars(t)}
    ours = {(t, s) for t, s, _ in _rows(tb.read(p, tmp_path)) if t == "train/loss"}
    assert ours == theirs


@pytest.mark.parametrize("where", ["payload", "length", "length_crc", "payload_crc"])
def test_corrupt_record_in_the_middle(event_file, tmp_path, where):
    """One damaged record is skipped (resync after a bad length); all others kept."""
    data = bytearray(event_file.read_bytes())
    spans = _frames(bytes(data))
    k = len(spans) // 2
    start, end = spans[k]
    at = {"payload": start + 12 + (end - start - 16) // 2, "length": start + 1, "length_crc": start + 9,
          "payload_crc": end - 2}[where]
    data[at] ^= 0x5A
    p = tmp_path / "events.out.tfevents.bad"
    p.write_bytes(bytes(data))
    clean = tmp_path / "events.out.tfevents.clean"
    clean.write_bytes(bytes(data[:start]) + event_file.read_bytes()[end:])
    res = tb.read(p, tmp_path)
    assert _rows(res) == _rows(tb.read(clean, tmp_path))  # every other record kept
    assert [s.what for s in res.skipped] == [f"events.out.tfevents.bad:{start}"]
    reason = res.skipped[0].reason
    if where.startswith("length"):
        assert "bad length CRC" in reason and f"resynchronised at byte {end}" in reason
    else:
        assert "bad payload CRC" in reason


def test_absurd_length_and_zero_tail(tmp_path):
    """An absurd length is never allocated; a zero-filled tail is named as such."""
    ev = [_event(s, _value("loss", simple=float(s))) for s in range(1, 6)]
    p = _write(tmp_path / "events.out.tfevents.a", ev)
    data = bytearray(p.read_bytes())
    start = _frames(bytes(data))[2][0]
    huge = struct.pack("<Q", 1 << 40)  # a valid length CRC on an absurd length: never allocated
    data[start:start + 12] = huge + struct.pack("<I", tb.masked_crc32c(huge))
    p.write_bytes(bytes(data) + b"\x00" * 5000)
    res = tb.read(p, tmp_path)
    assert [r[1] for r in _rows(res)] == [1, 3, 4, 5]
    assert "absurd length" in res.skipped[0].reason
    assert "zero-filled tail" in res.skipped[1].reason


def test_crc_switch(tmp_path, monkeypatch):
    """check_crc=False and the module-level CHECK_CRC switch skip the CRC checks."""
    p = _write(tmp_path / "events.out.tfevents.a", [_event(s, _value("x", simple=1.5)) for s in range(1, 4)])
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF  # last payload CRC
    p.write_bytes(bytes(data))
    assert len(_rows(tb.read(p, tmp_path))) == 2
    assert len(_rows(tb.read(p, tmp_path, check_crc=False))) == 3
    monkeypatch.setattr(tb, "CHECK_CRC", False)
    assert len(_rows(tb.read(p, tmp_path))) == 3


def test_step_rewind_and_session_start_make_local_segments(tmp_path):
    """A per-tag step rewind and a SessionLog START open local segments."""
    start = _vi(1, 1)  # SessionLog{status: START}
    ev = [_event(s, _value("loss", simple=float(s))) for s in range(1, 6)]
    ev += [_event(3, _value("loss", simple=30.0)), _event(4, _value("loss", simple=40.0))]  # rewind
    ev += [_event(4, extra=_ld(7, start)), _event(4, _value("loss", simple=41.0))]  # purge_step START
    res = tb.read(_write(tmp_path / "events.out.tfevents.a", ev), tmp_path)
    assert res.metrics.column("segment").to_pylist() == [0, 0, 0, 0, 0, 1, 1, 2]
    assert res.events.column("kind").to_pylist() == ["restart"]
    assert res.events.column("step").to_pylist() == [4] and res.meta["session_starts"] == 1


def test_crafted_tensor_scalars(tmp_path):
    """Tensor scalars of every dtype and layout; non-scalars and other plugins counted only."""
    f = lambda x: struct.pack("<f", x)  # noqa: E731
    half = struct.unpack("<H", struct.pack("<e", 1.5))[0]
    shape0 = _ld(2, b"")
    tensors = {
        "f_content": _vi(1, 1) + shape0 + _ld(4, f(2.5)),
        "d_content": _vi(1, 2) + shape0 + _ld(4, struct.pack("<d", 0.1)),
        "f_unpacked": _vi(1, 1) + shape0 + _vint(5 << 3 | 5) + f(3.25),
        "d_val": _vi(1, 2) + shape0 + _ld(6, struct.pack("<d", 1e-300)),
        "half": _vi(1, 19) + shape0 + _ld(13, _vint(half)),
        "bf16": _vi(1, 14) + shape0 + _vi(13, 0x3FC0),  # 1.5 in bfloat16
        "i64": _vi(1, 9) + shape0 + _ld(10, _vint(-7)),
        "i32_content": _vi(1, 3) + shape0 + _ld(4, struct.pack("<i", -3)),
        "vector": _vi(1, 1) + _ld(2, _ld(2, _vi(1, 3))) + _ld(4, f(1) * 3),
        "string": _vi(1, 7) + shape0 + _ld(8, b"hello"),
    }
    ev = [_event(s, _value(tag, tensor=t)) for tag, t in tensors.items() for s in (1, 2)]
    ev += [_event(1, _value("custom", tensor=tensors["f_content"], plugin="my_plugin")),
           _event(2, _value("custom", tensor=tensors["f_content"]))]  # metadata only on the first event
    res = tb.read(_write(tmp_path / "events.out.tfevents.a", ev), tmp_path)
    vals = {(t, s): v for t, s, v in _rows(res)}
    assert vals[("f_content", 2)] == 2.5 and vals[("d_content", 2)] == 0.1 and vals[("f_unpacked", 1)] == 3.25
    assert vals[("d_val", 2)] == 1e-300 and vals[("half", 1)] == 1.5 and vals[("bf16", 2)] == 1.5
    assert vals[("i64", 1)] == -7.0 and vals[("i32_content", 2)] == -3.0
    assert ("vector", 1) not in vals and ("string", 1) not in vals and ("custom", 2) not in vals
    assert res.meta["non_scalar"] == {"tensor": 6}  # vector x2, string x2, custom-plugin scalar x2
    assert res.meta["plugins"] == {"custom": "my_plugin"}
    assert res.meta["encodings"]["d_val"] == "DT_DOUBLE" and res.meta["encodings"]["half"] == "DT_HALF"


def test_large_steps_negative_steps_and_nan(tmp_path):
    """Multi-byte and negative varint steps; NaN and inf kept."""
    ev = [_event(s, _value("loss", simple=v)) for s, v in ((127, 1.0), (128, math.inf), (2**40, math.nan))]
    ev.append(_event(-5, _value("loss", simple=-0.0)))
    res = tb.read(_write(tmp_path / "events.out.tfevents.a", ev), tmp_path)
    rows = _rows(res)
    assert [r[1] for r in rows] == [127, 128, 2**40, -5]
    assert rows[1][2] == math.inf and math.isnan(rows[2][2])
    assert res.metrics.column("segment").to_pylist() == [0, 0, 0, 1]


def test_empty_and_garbage_files(tmp_path):
    """An empty file is a Skip; a file with no TFRecord frame is a ParseError."""
    empty = tmp_path / "events.out.tfevents.empty"
    empty.write_bytes(b"")
    res = tb.read(empty, tmp_path)
    assert res.metrics.num_rows == 0 and "empty event file" in res.skipped[0].reason
    junk = tmp_path / "events.out.tfevents.junk"
    junk.write_bytes(bytes(range(256)) * 20)
    with pytest.raises(ParseError):
        tb.read(junk, tmp_path)


def test_lightning_resume_case(cases_dir):
    """br04: two Lightning version folders, the second resumes at a step the first logged."""
    root = cases_dir / "br04_lightning_resume_explr"
    files = sorted((root / "lightning_logs").glob("version_*/events.out.tfevents.*"))
    assert len(files) == 2
    a, b = (tb.read(f, root) for f in files)
    last_a = max(a.metrics.column("step").to_pylist())
    first_b = min(b.metrics.column("step").to_pylist())
    assert first_b <= last_a == 500  # the resumed file goes back: a new global segment in discovery
    lr_b = {s: v for t, s, v in _rows(b) if t == "lr-Adam"}
    assert lr_b[500] == pytest.approx(1e-3)
    assert set(a.metrics.column("metric").to_pylist()) >= {"lr", "loss", "eval_loss"}


def test_undecodable_event_and_plugin_change(tmp_path):
    """A well-framed but undecodable payload is one Skip; a tag whose plugin changes stops being a scalar."""
    scalar = _vi(1, 1) + _ld(2, b"") + _ld(4, struct.pack("<f", 1.0))
    ev = [_event(1, _value("x", tensor=scalar)), _event(2, _value("x", tensor=scalar)),
          b"\x0f\x00\x01",  # field 1 with wire type 7: not protobuf
          _event(3, _value("x", tensor=scalar, plugin="custom")), _event(4, _value("x", tensor=scalar))]
    p = _write(tmp_path / "events.out.tfevents.a", ev)
    res = tb.read(p, tmp_path)
    assert [s for _, s, _ in _rows(res)] == [1, 2]
    bad_at = _frames(p.read_bytes())[3][0]
    assert [s.what for s in res.skipped] == [f"events.out.tfevents.a:{bad_at}"]
    assert "undecodable" in res.skipped[0].reason and res.meta["non_scalar"] == {"tensor": 2}


# ------------------------------------------------ compiled scan against the Python walk


def _both(path: Path, root: Path, monkeypatch) -> tuple:
    out = []
    for size in (0, 1 << 62):  # vectorised windows, then Python
        monkeypatch.setattr(tb, "FAST_MIN_BYTES", size)
        out.append(tb.read(path, root))
    return tuple(out)


def _decoded(t: pa.Table) -> pa.Table:
    """``t`` with its dictionary text columns as plain strings (two walks may order a dictionary differently)."""
    return pa.table({n: c.cast(pa.string()) if pa.types.is_dictionary(c.type) else c
                     for n, c in zip(t.column_names, t.columns, strict=True)})


def _same(a, b, what: str) -> None:
    va, vb = (r.metrics.column("value").to_numpy(zero_copy_only=False) for r in (a, b))
    assert np.array_equal(va.view(np.int64), vb.view(np.int64)), f"{what}: values differ"
    assert _decoded(a.metrics.drop_columns(["value"])).equals(_decoded(b.metrics.drop_columns(["value"]))), what
    assert a.events.equals(b.events) and a.meta == b.meta and a.skipped == b.skipped, what


def test_aggregated_payload_crc_finds_every_bad_record() -> None:
    """One crc32c pass per window with unmasked stored CRCs flags exactly the records whose CRC fails.

    Random records of 0-300 bytes, some with a flipped payload bit or stored-CRC bit, several per
    chunk and one chunk with many: the aggregated check agrees with a per-record check every time.
    """
    from parsers import _tfrecord

    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(_tfrecord.unmask(_tfrecord.mask(x)), x)
    for trial in range(6):
        payloads = [rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes() for _ in range(3000)]
        data = bytearray(b"".join(_record(p) for p in payloads))
        spans = _frames(bytes(data))
        flip = set(rng.choice(len(spans), size=[0, 1, 2, 5, 40, 300][trial], replace=False).tolist())
        if trial == 4:
            flip |= set(range(1100, 1140))  # many in one chunk
        for k in flip:
            a, e = spans[k]
            where = int(rng.integers(a + 12, e))  # a payload byte or a stored-CRC byte
            data[where] ^= 1 << int(rng.integers(0, 8))
        buf = np.frombuffer(bytes(data) + bytes(_tfrecord.PAD), np.uint8)
        at = np.array([a for a, _ in spans], np.int64)
        length = np.array([e - a - 16 for a, e in spans], np.int64)
        ok = _tfrecord._payload_crc_ok(buf, at, length)
        assert set(np.flatnonzero(~ok).tolist()) == flip, trial


def test_compiled_and_python_walks_agree_on_every_sample_file(monkeypatch) -> None:
    """Every event file in sample_logs/ (real SummaryWriter runs) reads bit-identically both ways."""
    files = sorted((Path(__file__).resolve().parents[1] / "sample_logs").rglob("*tfevents*"))
    assert len(files) >= 20
    for f in files:
        _same(*_both(f, f.parent, monkeypatch), str(f))


def test_compiled_and_python_walks_agree_on_case_files(monkeypatch, cases_dir) -> None:
    """Every event file in the shared cases reads bit-identically both ways."""
    for f in sorted(cases_dir.rglob("*tfevents*")):
        _same(*_both(f, f.parent, monkeypatch), str(f))


def test_compiled_and_python_walks_agree_on_damaged_files(real_run, tmp_path, monkeypatch) -> None:
    """Flipped bytes, cuts, garbage, zero runs: the same rows, damage list and meta both ways."""
    data = _main_file(real_run).read_bytes()
    rng = np.random.default_rng(3)
    for k in range(60):
        bad = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(0, len(bad)))
            if k % 3 == 0:
                bad[i] ^= 1 << int(rng.integers(0, 8))
            elif k % 3 == 1:
                bad[i:i + 40] = bytes(40)
            else:
                bad[i:i] = rng.integers(0, 256, int(rng.integers(1, 30)), dtype=np.uint8).tobytes()
        cut = len(bad) - int(rng.integers(0, 50))
        p = tmp_path / f"events.out.tfevents.{k}"
        p.write_bytes(bytes(bad[:cut]))
        try:
            a, b = _both(p, tmp_path, monkeypatch)
        except ParseError as exc:  # both must refuse
            monkeypatch.setattr(tb, "FAST_MIN_BYTES", 0)
            with pytest.raises(ParseError, match=str(exc.args[-1])[:20]):
                tb.read(p, tmp_path)
            continue
        _same(a, b, f"variant {k}")


def test_fuzz_compiled_scan_against_python_walk(tmp_path, monkeypatch) -> None:
    """Hypothesis: scalar-like events with random byte edits read the same by both walks.

    Every encoding, odd steps and tags: the compiled fast path never accepts a payload the general
    decoder reads differently.
    """
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    f32 = lambda x: struct.pack("<f", x)  # noqa: E731
    values = hs.one_of(
        hs.builds(lambda v: dict(simple=v), hs.floats(width=32)),
        hs.builds(lambda v: dict(tensor=_vi(1, 1) + _ld(5, f32(v))), hs.floats(width=32)),
        hs.builds(lambda v: dict(tensor=_vi(1, 2) + _ld(2, b"") + _ld(6, struct.pack("<d", v))), hs.floats()),
        hs.builds(lambda v: dict(tensor=_vi(1, 1) + _ld(4, f32(v))), hs.floats(width=32)),
        hs.builds(lambda v: dict(tensor=_vi(1, 1) + _ld(5, f32(v) * 2)), hs.floats(width=32)),  # two values
        hs.builds(lambda v: dict(tensor=_vi(1, 1) + _ld(5, f32(v)), plugin="scalars"), hs.floats(width=32)),
        hs.builds(lambda v: dict(tensor=_vi(1, 1) + _ld(5, f32(v)), plugin="histograms"), hs.floats(width=32)),
    )
    event = hs.tuples(hs.integers(-(2**63), 2**63 - 1), hs.text(max_size=12) | hs.sampled_from(["loss", "lr"]),
                      values, hs.lists(hs.tuples(hs.integers(0, 200), hs.integers(0, 255)), max_size=2))

    examples = int(os.environ.get("FORENSICS_FUZZ_EXAMPLES", "150"))  # CI: a fixed sample; longer runs by hand

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=examples <= 150)
    @given(hs.lists(event, min_size=1, max_size=8))
    def run(events) -> None:  # noqa: ANN001
        payloads = []
        for step, tag, val, edits in events:
            p = bytearray(_event(step, _value(tag, **val)))
            for at, byte in edits:
                if at < len(p):
                    p[at] = byte
            payloads.append(bytes(p))
        path = _write(tmp_path / "events.out.tfevents.fuzz", payloads)
        try:
            a, b = _both(path, tmp_path, monkeypatch)
        except ParseError:
            return
        _same(a, b, "fuzzed events")

    run()


def test_ten_byte_varint_step_keeps_low_64_bits(tmp_path) -> None:
    """A step varint carrying more than 64 bits is read as protobuf does: its low 64 bits, as int64.

    Found by the compiled-vs-Python fuzz: it crashed the Python walk.
    """
    step = b"\xff" * 9 + b"\x7f"  # 70 one-bits; low 64 bits = -1
    payload = _vint(1 << 3 | 1) + struct.pack("<d", 1.7e9) + b"\x10" + step + _ld(5, _value("loss", simple=1.0))
    res = tb.read(_write(tmp_path / "events.out.tfevents.a", [payload]), tmp_path)
    assert _rows(res) == [("loss", -1, 1.0)] and not res.skipped


def test_packed_float_val_of_two_values_in_a_double_tensor_is_not_a_scalar(tmp_path) -> None:
    """DT_DOUBLE with ``float_val`` packed as 8 bytes holds two floats, not one double.

    Found by the compiled-vs-Python fuzz in CI: the compiled scan read it as a double scalar.
    """
    tensor = _vi(1, 2) + _ld(5, struct.pack("<ff", 0.5, 0.25))
    res = tb.read(_write(tmp_path / "events.out.tfevents.a", [_event(1, _value("x", tensor=tensor))]), tmp_path)
    assert res.metrics.num_rows == 0 and res.meta["non_scalar"] == {"tensor": 1}


def test_undecodable_event_after_a_scalar_leaves_no_trace(tmp_path) -> None:
    """An event whose scalar decodes before a later field fails is dropped whole, encoding included.

    Found by a long fuzz run: the dropped row's encoding stayed behind and shifted the next tags' encodings.
    """
    bad = bytearray(_event(0, _value("", simple=0.0)))
    bad[0] = 0x39  # field 7 (session_log) as fixed64: undecodable after the summary was read
    tensor = _vi(1, 1) + _ld(5, struct.pack("<f", 0.0))
    res = tb.read(_write(tmp_path / "events.out.tfevents.a", [bytes(bad), _event(0, _value("0", tensor=tensor))]),
                  tmp_path)
    assert res.meta["encodings"] == {"0": "DT_FLOAT"}


def test_tag_length_varint_over_2_63_is_not_an_index(tmp_path, monkeypatch) -> None:
    """A tag length that reads as a negative int64 is undecodable, not a memory read before the tag.

    Found by a long fuzz run: the compiled scan indexed with it (a segfault).
    """
    value = b"\x0a" + _vint(1 << 63 | 5) + b"x" + b"\x15" + struct.pack("<f", 1.0)
    payload = _vint(1 << 3 | 1) + struct.pack("<d", 1.7e9) + _ld(5, _ld(1, value))
    good = _event(2, _value("loss", simple=2.0))
    a, b = _both(_write(tmp_path / "events.out.tfevents.a", [payload, good]), tmp_path, monkeypatch)
    _same(a, b, "negative tag length")
    assert _rows(a) == [("loss", 2, 2.0)] and len(a.skipped) == 1


def test_fuzz_random_payloads_both_walks(tmp_path, monkeypatch) -> None:
    """Hypothesis: random payloads in valid frames (and random tails) never crash either walk; both agree.

    The compiled scan reads raw memory without bounds checks, so garbage with good CRCs must be safe there.
    """
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    head = _vint(1 << 3 | 1) + struct.pack("<d", 1.7e9)
    payload = hs.binary(max_size=60) | hs.builds(lambda b: head + b"\x2a" + b, hs.binary(max_size=40)) | hs.builds(
        lambda b: head + b"\x2a" + bytes([len(b) + 2]) + b"\x0a" + bytes([len(b)]) + b, hs.binary(max_size=40))
    examples = int(os.environ.get("FORENSICS_FUZZ_EXAMPLES", "150"))

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=examples <= 150)
    @given(hs.lists(payload, min_size=1, max_size=6), hs.binary(max_size=20))
    def run(payloads, tail) -> None:  # noqa: ANN001
        path = _write(tmp_path / "events.out.tfevents.fuzz", payloads)
        path.write_bytes(path.read_bytes() + tail)
        try:
            a, b = _both(path, tmp_path, monkeypatch)
        except ParseError:
            return
        _same(a, b, "random payloads")

    run()


def test_small_windows_read_the_same(real_run, tmp_path, monkeypatch) -> None:
    """Windows of a few hundred bytes read exactly as the Python walk does.

    Frames cut at every window end, records longer than a window, damage and resynchronisation across windows.
    """
    from parsers import _tfrecord

    data = _main_file(real_run).read_bytes()
    rng = np.random.default_rng(7)
    variants = [data, data[:-7], data[:5000] + bytes(3000) + data[5000:], data[:9000] + b"\xff" * 40 + data[9040:]]
    for _ in range(8):
        bad = bytearray(data)
        i = int(rng.integers(0, len(bad)))
        bad[i] ^= 1 << int(rng.integers(0, 8))
        variants.append(bytes(bad))
    for window in (97, 300, 4096):
        monkeypatch.setattr(_tfrecord, "WINDOW", window)
        for k, v in enumerate(variants):
            p = tmp_path / f"events.out.tfevents.w{window}.{k}"
            p.write_bytes(v)
            _same(*_both(p, tmp_path, monkeypatch), f"window {window}, variant {k}")


_RSS_DRIVER = r"""
import re, sys
from pathlib import Path
from parsers import tensorboard as tb
p = Path(sys.argv[1])
res = tb.read(p, p.parent)
print(res.metrics.num_rows, len(res.skipped), res.skipped[-1].reason if res.skipped else "",
      int(re.search(r"VmHWM:\s*(\d+)", open("/proc/self/status").read()).group(1)) * 1024)
"""


def test_large_written_file_is_read_in_bounded_memory(real_run, tmp_path, decoder) -> None:
    """512 MiB of written (not sparse) zeros after real records: read in windows, peak RSS well under the size.

    Issue 16: the whole-file memory map counted every page it touched to RSS (a 5 GiB file, 10.5 GB).
    """
    import subprocess
    import sys

    if not Path("/proc/self/status").exists():  # ru_maxrss would carry the parent's peak across fork + exec
        pytest.skip("peak RSS of this process (VmHWM) needs Linux /proc")

    if decoder == "python":
        pytest.skip("the subprocess reads with the default walk (windows for a file this size)")
    src = _main_file(real_run).read_bytes()
    p = tmp_path / "events.out.tfevents.big"
    with open(p, "wb") as fh:
        fh.write(src)
        block = bytes(16 << 20)
        for _ in range(32):
            fh.write(block)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _RSS_DRIVER, str(p)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)}, cwd=root).stdout.split()  # cwd: this checkout
    rows, skips, peak = int(out[0]), int(out[1]), int(out[-1])
    assert rows == tb.read(_main_file(real_run), real_run).metrics.num_rows and skips == 1
    assert "zero-filled tail" in " ".join(out[2:-1])
    assert peak < 400 << 20, f"peak RSS {peak >> 20} MiB for a {p.stat().st_size >> 20} MiB file"


def test_many_tags_of_one_length_and_mixed_layouts(tmp_path, monkeypatch) -> None:
    """600 per-layer tags of one length, in three layouts, steps of 1-3 varint bytes: both walks agree.

    The vectorised walk reads them by layout (one hashed round for all tags of a length): every
    scalar event is decoded there, none is left to the general decoder.
    """
    payloads = []
    for step in (1, 200, 70000):
        for k in range(600):
            tag = f"layer_{k:03d}/grad_norm"
            val = (dict(simple=k * 0.5) if k % 3 == 0 else
                   dict(tensor=_vi(1, 1) + _ld(2, b"") + _ld(5, struct.pack("<f", k)), plugin="scalars")
                   if k % 3 == 1 else dict(tensor=_vi(1, 2) + _ld(6, struct.pack("<d", k / 7))))
            payloads.append(_event(step, _value(tag, **val)))
    path = _write(tmp_path / "events.out.tfevents.many", payloads)
    a, b = _both(path, tmp_path, monkeypatch)
    _same(a, b, "many tags")
    assert a.metrics.num_rows == 1800 and a.metrics.column("tag").to_pylist()[601] == "layer_001/grad_norm"
    calls = []
    generic = tb.State.generic
    monkeypatch.setattr(tb.State, "generic", lambda self, p: (calls.append(p), generic(self, p)))
    monkeypatch.setattr(tb, "FAST_MIN_BYTES", 0)
    tb.read(path, tmp_path)
    assert len(calls) == 1  # the file_version record only
    monkeypatch.setattr(tb.State, "generic", generic)
    monkeypatch.setattr(tb._tb_fast, "MAX_LAYOUTS", 2)  # too many layouts for a round: one per round, then general
    _same(*_both(path, tmp_path, monkeypatch), "many tags, few layouts a round")


def test_ingest_of_a_tensorboard_run_imports_no_pandas(tmp_path, decoder) -> None:
    """``forensics ingest`` of a TensorBoard run never imports pandas (~0.2 s of start-up in every process).

    ``pa.scalar``, ``pc.equal(column, 0)`` and ``Schema.empty_table()`` import it through pyarrow.
    """
    import subprocess
    import sys

    if decoder == "python":
        pytest.skip("the subprocess reads with the default walk (windows for a file this size)")
    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    _write(run / "events.out.tfevents.1.host", [_event(s, _value("loss", simple=1 / (s + 1))) for s in range(12000)])
    assert (run / "events.out.tfevents.1.host").stat().st_size >= tb.FAST_MIN_BYTES  # the vectorised walk
    code = ("import sys; from forensics.cli import main\n"
            "sys.argv = ['forensics', 'ingest', sys.argv[1], '-o', sys.argv[2]]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('pandas' in sys.modules, 'numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path / "out")], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(root)}, cwd=root).stdout.split()
    assert out[-2:] == ["False", "False"], out
    assert (tmp_path / "out" / "metrics.parquet").exists()
