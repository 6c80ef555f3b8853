"""Shared parts of the robustness suites (``tests/test_robustness_*.py``).

Small real base files per parser, reading a damaged copy, comparing the complete records kept, the
hypothesis settings of the fuzzers, and the figures counter.

Each suite adds to :data:`FIGURES` (``(parser, "inputs" | "crashes" | "lost") -> count``); the closing
note's figures are printed by ``test_robustness_values.py::test_figures`` with ``-s``.
"""

from __future__ import annotations

import importlib
import json
import random
import struct
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from forensics.errors import ParseError
from parsers.wandb_log import BLOCK, FULL, LAST, MAGIC

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
WANDB = SAMPLES / "wandb_healthy" / "wandb" / "offline-run-20261129_182116-healthy0" / "run-healthy0.wandb"
MAX_EVERY_OFFSET = 1200  # files up to this size are cut at every byte offset; bigger ones at a dense sample
FIGURES: Counter = Counter()  # (parser, "inputs" | "crashes" | "lost") -> count, for the closing note

GZIP_READ: dict[str, bool] = {}  # parser -> whether a .gz copy of its base file is recognised

# -- base files: small real files, each cut at a record boundary ------------------------------------------


def _line_ends(data: bytes) -> list[int]:
    return [i + 1 for i, c in enumerate(data) if c == 0x0A]


def _tb_ends(data: bytes) -> list[int]:
    ends, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 16 + n
        if pos > len(data):
            break
        ends.append(pos)
    return ends


def _wandb_ends(data: bytes) -> list[int]:
    """Offsets just after each complete record (FULL or LAST chunk), and the end of each block's padding."""
    ends, pos = [0, len(MAGIC)], len(MAGIC)
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        if pos + 7 > len(data):
            break
        _, length, typ = struct.unpack_from("<IHB", data, pos)
        pos += 7 + length
        if pos > len(data):
            break
        if typ in (FULL, LAST):
            ends.append(pos)
    return ends


def _prefix(data: bytes, ends: list[int], limit: int) -> bytes:
    return data[:max(e for e in ends if e <= limit)]


def _first_tfevents(folder: Path) -> Path:
    return sorted(folder.glob("events.out.tfevents.*"))[0]


def _bases(cases: Path | None) -> list[tuple[str, str, bytes]]:
    """``(parser module, file name, bytes)``: small real files of every format."""
    jl = (SAMPLES / "healthy" / "metrics.jsonl").read_bytes()
    tl = (SAMPLES / "healthy" / "train.log").read_bytes()
    tb = _first_tfevents(SAMPLES / "healthy").read_bytes()
    wb = WANDB.read_bytes()
    out = [
        ("parsers.jsonl", "metrics.jsonl", _prefix(jl, _line_ends(jl), 1000)),
        ("parsers.textlog", "train.log", _prefix(tl, _line_ends(tl), 700)),
        ("parsers.tensorboard", "events.out.tfevents.1795976115.vm.1093.0", _prefix(tb, _tb_ends(tb), 1200)),
        ("parsers.wandb_run", "run-healthy0.wandb", _prefix(wb, _wandb_ends(wb), 6000)),
        ("parsers.mlflow_store", "loss", b"".join(  # an MLflow file-store metric file (docs/formats.md#mlflow)
            f"{1700000000000 + 1500 * s} {2.5 - s / 64:.17g} {10 * s}\n".encode() for s in range(12))
         + b"1700000020000 nan 120\n1700000021000 inf 130\n1700000022000 1.25\n"),
    ]
    if cases is not None:
        csv = (cases / "br16_shuffle_phase_shift" / "wandb_export" / "history.csv").read_bytes()
        hf = (cases / "br08_t5_fp16_ff_overflow" / "t5-base-summ" / "checkpoint-20" / "trainer_state.json")
        tl2 = (cases / "br03_multisteplr_resume" / "train.log").read_bytes()
        out += [("parsers.csv_metrics", "history.csv", _prefix(csv, _line_ends(csv), 900)),
                ("parsers.hf_trainer", "trainer_state.json", hf.read_bytes()),
                ("parsers.textlog", "train.log", tl2)]
    else:  # the same shapes, written here (the acceptance cases are not checked out)
        rows = "".join(f"{s},{s * 6.1:.1f},{1748912345 + s * 6.1:.3f},0.0003,{2.5 - s / 1e5:.6f},,1297434.9\n"
                       for s in range(180000, 180010))
        csv = ("_step,_runtime,_timestamp,optim/learning_rate,train/loss,eval/loss,throughput/tokens_per_second\n"
               + rows).encode()
        hist = [{"epoch": 0.01 * i, "grad_norm": 1.5 + i, "learning_rate": 5e-5, "loss": 3.2 - 0.1 * i,
                 "step": 10 * i} for i in range(1, 5)]
        hf = json.dumps({"global_step": 70, "log_history": hist, "max_steps": 100}, indent=2).encode()
        out += [("parsers.csv_metrics", "history.csv", csv), ("parsers.hf_trainer", "trainer_state.json", hf)]
    return out


def _cases(request: pytest.FixtureRequest) -> Path | None:
    try:
        return request.getfixturevalue("cases_dir")
    except pytest.skip.Exception:
        return None


# -- reading and comparing ----------------------------------------------------------------------------


def _rows(pr, with_segment: bool = True) -> Counter:  # noqa: ANN001
    """Multiset of metric rows; floats by their bits (NaN == NaN)."""
    t = pr.metrics
    cols = [t.column(c).to_pylist() for c in ("segment", "step", "metric", "tag", "value", "wall_time")]
    out: Counter = Counter()
    for seg, step, metric, tag, value, wall in zip(*cols, strict=True):
        key = (step, metric, tag, None if value is None else struct.pack("<d", value),
               None if wall is None else struct.pack("<d", wall))
        out[(seg, *key) if with_segment else key] += 1
    return out


def _read(mod_name: str, folder: Path, name: str, data: bytes):  # noqa: ANN202
    """Write ``data`` as ``folder/name`` and read it: the ParseResult, or None for a ParseError.

    Any other exception is counted as a crash and re-raised.
    """
    mod = importlib.import_module(mod_name)
    path = folder / name
    path.write_bytes(data)
    FIGURES[(mod_name, "inputs")] += 1
    try:
        return mod.read(path, folder)
    except ParseError:
        return None
    except Exception:
        FIGURES[(mod_name, "crashes")] += 1
        raise


def _ends_of(mod_name: str, data: bytes) -> list[int]:
    if mod_name == "parsers.tensorboard":
        return [0, *_tb_ends(data)]
    if mod_name == "parsers.wandb_run":
        return _wandb_ends(data)
    if mod_name == "parsers.hf_trainer":
        return [0, len(data)]  # one JSON document: complete only as a whole
    return [0, *_line_ends(data)]


def _where(skips, rel: str) -> list[int]:  # noqa: ANN001
    """The offsets/lines of the skips that name ``rel`` with a position."""
    out = []
    for s in skips:
        head, _, pos = s.what.rpartition(":")
        if head == rel and pos.isdigit():
            out.append(int(pos))
    return out


def _check_kept(mod_name: str, expected, got, what: str, with_segment: bool = True) -> None:  # noqa: ANN001
    """Every row of ``expected`` (the read of the clean part) is in ``got`` (the damaged read)."""
    if expected is None:
        return
    want = _rows(expected, with_segment)
    have = Counter() if got is None else _rows(got, with_segment)
    lost = want - have
    if lost:
        FIGURES[(mod_name, "lost")] += sum(lost.values())
    assert not lost, f"{mod_name} {what}: {sum(lost.values())} complete row(s) lost, e.g. {next(iter(lost))}"


def _offsets(n: int, rng: random.Random, dense: int = 200) -> list[int]:
    if n <= MAX_EVERY_OFFSET:
        return list(range(n + 1))
    return sorted({0, n, *rng.sample(range(n), dense)})


_fuzz = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
