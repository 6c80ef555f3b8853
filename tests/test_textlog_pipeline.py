"""The text reader's two-thread pipeline (parsers/_textlog_prep.py) gives what the sequential order gives.

Blocks are made small here (3,000 lines) so that a file of ~20,000 lines crosses several of them, with the
shapes, rank prefixes, tracebacks, NUL bytes, a gzip stream cut short and an unterminated last line that the
assembler's state must carry from block to block.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from parsers import _textlog_prep, textlog


def _write(path: Path, n: int = 20_000, *, cut: bool = True) -> None:
    out = []
    for i in range(n):
        k = i % 7
        if k == 0:
            out.append(f"[rank{i % 4}]: step={i} loss={3 + 1 / (i + 1):.4f}\n")
        elif k == 1:
            out.append(f"iter {i} | loss: {3 + 1 / (i + 1):.4f} | lr: 1e-4\n")
        elif k == 2 and i % 5000 == 2:
            out.append("Traceback (most recent call last):\n  File \"train.py\", line 3\nRuntimeError: CUDA error\n")
        elif k == 3 and i == 10_003:
            out.append("bad\0\0\0line\n")
        elif i == 12_000:
            out.append("step:0/20000 train_loss:9.0 train_time:0ms\n")  # a restart: a new segment
        else:
            out.append(f"step:{i}/20000 train_loss:{3 + 1 / (i + 1):.4f} train_time:{i}ms\n")
    text = "".join(out) + ("step=20001 loss=3." if cut else "")
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode())[:-40])  # the stream is cut short near its end
    else:
        path.write_text(text)


def _sequential(monkeypatch: pytest.MonkeyPatch) -> None:
    def submit(self: _textlog_prep.Pipeline, pieces: list[str]) -> None:
        self.lineno = self.consume(self.prep(pieces), self.lineno)

    monkeypatch.setattr(_textlog_prep.Pipeline, "submit", submit)


@pytest.mark.parametrize("name", ["train.log", "train.log.gz"])
def test_pipeline_equals_the_sequential_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Rows, events, meta and skips of a many-block file: threaded == sequential (a cut gzip stream too)."""
    path = tmp_path / name
    _write(path)
    monkeypatch.setattr(textlog, "_BLOCK", 3000)
    monkeypatch.setattr(textlog._Reader, "SMALL", 500)
    threaded = textlog.read(path, tmp_path)
    with monkeypatch.context() as m:
        _sequential(m)
        plain = textlog.read(path, tmp_path)
    assert threaded.metrics.num_rows > 15_000
    assert threaded.metrics.equals(plain.metrics)
    assert threaded.events.equals(plain.events)
    assert threaded.meta == plain.meta
    assert threaded.skipped == plain.skipped
    assert len({s for s in threaded.metrics.column("segment").to_pylist()}) >= 2  # the restart carried across blocks
    if name.endswith(".gz"):
        assert any("unreadable from here on" in s.reason for s in threaded.skipped)
    else:
        assert any("unterminated last line" in s.reason for s in threaded.skipped)


def test_a_failing_block_stops_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error while a block is assembled comes out of ``read``; the worker thread does not outlive it."""
    import threading

    path = tmp_path / "train.log"
    _write(path, cut=False)
    monkeypatch.setattr(textlog, "_BLOCK", 3000)
    calls = []

    def consume(self, prep, lineno):  # noqa: ANN001, ANN202
        calls.append(lineno)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return lineno + prep.n_ends

    monkeypatch.setattr(textlog._Reader, "consume", consume)
    with pytest.raises(RuntimeError, match="boom"):
        textlog.read(path, tmp_path)
    assert not [t for t in threading.enumerate() if t.name.startswith("textlog")]
