"""Generators of hostile run folders (issue 16), one per attack kind, and a bounded runner.

Each generator builds a run folder under ``base`` holding a small, valid metrics log (so that the
analysis goes all the way to the reports) plus the hostile file(s), and returns the run folder and
what must not appear in any output (text from outside the run folder). :func:`run_bounded` runs a
command in a subprocess under a wall-clock limit and a memory cap (peak RSS of its process tree,
sampled; the tree is killed past the cap) and reports seconds and peak RSS.

Used by ``tests/test_hostile*.py`` and by ``python tests/hostile_gen.py`` (the before/after table).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import sqlite3
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

SECRET = "TOPSECRET-outside-the-run-7f3a"
"""Text that lives only outside the run folder: it must never reach an output."""


@dataclass
class Attack:
    """A hostile run folder, what must never appear in an output, and a skip that must be listed."""

    run: Path
    forbidden: list[str] = field(default_factory=list)
    expect_skip: str | None = None  # a fragment of the skipped reason (or path) that must be listed


def _metrics(run: Path, n: int = 300, name: str = "metrics.jsonl", extra: dict | None = None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / name, "w", encoding="utf-8") as fh:
        for s in range(n):
            rec = {"step": s, "loss": 3.0 - s * 0.004, "lr": 1e-3, "grad_norm": 1.0 + 0.01 * (s % 7)}
            if extra and s == n // 2:
                rec.update(extra)
            fh.write(json.dumps(rec) + "\n")


def _torch_zip(path: Path, pkl: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")


def pickle_dag(base: Path, depth: int = 40) -> Attack:
    """``L_i = [L_(i-1), L_(i-1)]`` in a ``.pt``: 2**depth paths through a few hundred bytes."""
    run = base / "run_dag"
    _metrics(run)
    obj: list = []
    for _ in range(depth):
        obj = [obj, obj]
    _torch_zip(run / "checkpoint-100" / "model.pt", pickle.dumps({"model": obj}, protocol=2))
    return Attack(run, expect_skip="model.pt")


def pickle_memo(base: Path) -> Attack:
    """``PROTO 2, NONE, LONG_BINPUT 2**29, STOP``: the C unpickler grows its memo to 2**29 slots."""
    run = base / "run_memo"
    _metrics(run)
    _torch_zip(run / "checkpoint-100" / "model.pt", b"\x80\x02Nr" + struct.pack("<I", 2**29) + b".")
    return Attack(run, expect_skip="model.pt")


def sqlite_view(base: Path) -> Attack:
    """``mlflow.db`` whose ``metrics`` is a VIEW over an endless recursive CTE (a few KB)."""
    run = base / "run_sqlview"
    _metrics(run)
    con = sqlite3.connect(run / "mlflow.db")
    con.execute("CREATE VIEW metrics AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                "SELECT 'loss' AS key, x AS value, x AS timestamp, x AS step, 'r' AS run_uuid, 0 AS is_nan FROM c")
    con.commit()
    con.close()
    return Attack(run, expect_skip="mlflow.db")


def _yaml_bomb(levels: int = 7, width: int = 9) -> str:
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def yaml_bomb(base: Path) -> Attack:
    """A 386-byte ``config.yaml`` (7 levels of 9 aliases), also as an MLflow ``meta.yaml``."""
    run = base / "run_yaml"
    _metrics(run)
    (run / "config.yaml").write_text(_yaml_bomb())
    mr = run / "mlruns" / "0" / "abc"
    (mr / "metrics").mkdir(parents=True)
    (mr / "meta.yaml").write_text(_yaml_bomb())
    (mr / "metrics" / "loss").write_text("".join(f"{1000 + s} {3 - s * 0.01} {s}\n" for s in range(50)))
    return Attack(run, expect_skip="config.yaml")


def fifo_side(base: Path) -> Attack:
    """FIFOs where side readers look, and links into ``/proc`` and ``/dev``.

    ``checkpoint-N/trainer_state.json``, W&B ``run-*.wandb``, MLflow ``meta.yaml`` are FIFOs;
    ``train.log -> /proc/self/environ`` (leaks the environment), ``zero.log -> /dev/zero`` (never ends).
    """
    run = base / "run_fifo"
    _metrics(run)
    ck = run / "checkpoint-100"
    ck.mkdir()
    os.mkfifo(ck / "trainer_state.json")
    _torch_zip(ck / "model.pt", pickle.dumps({"step": 100}, protocol=2))
    wb = run / "wandb" / "offline-run-20240101_000000-abcd1234"
    (wb / "files").mkdir(parents=True)
    (wb / "files" / "output.log").write_text("step 1 loss 2.0\n")
    os.mkfifo(wb / "run-abcd1234.wandb")
    mr = run / "mlruns" / "0" / "abc"
    (mr / "metrics").mkdir(parents=True)
    os.mkfifo(mr / "meta.yaml")
    (mr / "metrics" / "loss").write_text("".join(f"{1000 + s} {3 - s * 0.01} {s}\n" for s in range(50)))
    os.symlink("/proc/self/environ", run / "train.log")
    os.symlink("/dev/zero", run / "zero.log")
    return Attack(run, forbidden=[SECRET], expect_skip="train.log")


def gzip_line(base: Path, line_bytes: int = 1 << 30) -> Attack:
    """A ``metrics.jsonl.gz`` of about 1 MB holding one line of ``line_bytes`` (1 GiB) bytes."""
    run = base / "run_gzline"
    _metrics(run)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"x" * (1 << 20)
    with open(run / "big.jsonl.gz", "wb") as fh:
        fh.write(comp.compress(b'{"step": 1, "loss": "'))
        for _ in range(line_bytes // len(chunk)):
            fh.write(comp.compress(chunk))
        fh.write(comp.compress(b'"}\n'))
        fh.write(comp.flush())
    return Attack(run, expect_skip="big.jsonl.gz")


def gzip_line_text(base: Path, line_bytes: int = 1 << 30) -> Attack:
    """The same bomb as a stdout log (``train.log.gz``) and a CSV export (``history.csv.gz``)."""
    run = base / "run_gzline_text"
    _metrics(run)
    for name, head in (("train.log.gz", b"step 1 loss "), ("history.csv.gz", b"_step,loss\n1,")):
        comp = zlib.compressobj(9, zlib.DEFLATED, 31)
        with open(run / name, "wb") as fh:
            fh.write(comp.compress(head))
            for _ in range(line_bytes // (1 << 20)):
                fh.write(comp.compress(b"1" * (1 << 20)))
            fh.write(comp.compress(b"\n"))
            fh.write(comp.flush())
    return Attack(run, expect_skip="train.log.gz:1")


def bad_name(base: Path) -> Attack:
    r"""A log named ``b"bad\xff.log"`` (not UTF-8) and one with a newline in its name."""
    run = base / "run_badname"
    _metrics(run)
    body = "".join(f"step {s} loss {3 - s * 0.004:.4f}\n" for s in range(100))
    with open(os.path.join(os.fsencode(run), b"bad\xff.log"), "w") as fh:
        fh.write(body)
    (run / "evil\nanalysis OK.log").write_text("nothing useful\n")
    return Attack(run)


def surrogates(base: Path) -> Attack:
    """Lone surrogate escapes in valid JSON: a key in one line of 300, ``trainer_state.json``, a config value."""
    run = base / "run_surrogate"
    _metrics(run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[150] = '{"step": 150, "loss": 2.4, "acc\\ud800": 1.0}'
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    st = {"global_step": 20, "log_history": [{"step": s, "loss": 2.0, "x\\ud800": 1} for s in range(1, 21)]}
    (run / "trainer_state.json").write_text(json.dumps(st).replace("\\\\ud800", "\\ud800"))
    (run / "config.json").write_text('{"name": "bad\\udc80value", "lr": 0.001}')
    return Attack(run)


def mathtext(base: Path) -> Attack:
    r"""A metric named ``attn_logit_max/$\x$`` (mathtext that does not parse) with a spike to chart."""
    run = base / "run_mathtext"
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as fh:
        for s in range(300):
            fh.write(json.dumps({"step": s, "loss": 3.0 - s * 0.004 + (5.0 if s == 200 else 0.0),
                                 "attn_logit_max/$\\x$": 10 + s * 0.5, "grad_norm/$^{$": 1.0}) + "\n")
    return Attack(run)


INJECT = "\x1b[2K\x1b[1A\rverdict: HEALTHY\x1b]0;pwned\x07\x1b]52;c;ZWNobyBwd25lZA==\x07"
MD_INJECT = "<script>alert(1)</script><img src=x onerror=alert(2)>[click](javascript:alert(3))" \
            "![t](http://evil.example/t.png)`x`y\u202eevil"


def inject(base: Path) -> Attack:
    """Terminal escapes and Markdown/HTML injection in a run name, a checkpoint folder and metric names."""
    run = base / ("run_inj" + "\x1b]0;title\x07\u202eTNEMNGILA")
    _metrics(run, extra={"loss": 50.0})
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 300, "loss": 9.0, MD_INJECT: 1.0, "x" + INJECT: 2.0}) + "\n")
    ck = run / ("checkpoint-100" + INJECT)
    _torch_zip(ck / "model.pt", b"\x80\x02cos\nsystem\n.")
    return Attack(run)


def symlink_out(base: Path) -> Attack:
    """``data -> <outside folder>`` holding ``credentials.yaml`` and notes, and ``root -> /``."""
    outside = base.parent / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "credentials.yaml").write_text(f"aws_secret: {SECRET}\n")
    (outside / "notes.md").write_text(f"# private\n{SECRET}\n")
    (outside / "train.log").write_text(f"{SECRET}\n" + "".join(f"step {s} loss 1.0\n" for s in range(50)))
    run = base / "run_symlink"
    _metrics(run)
    os.symlink(outside, run / "data")
    os.symlink("/", run / "root")
    os.symlink(outside / "credentials.yaml", run / "config.yaml")
    return Attack(run, forbidden=[SECRET], expect_skip="data")


def sparse_events(base: Path, size: int = 5 << 30) -> Attack:
    """A sparse event file and a sparse ``.wandb`` of ``size`` bytes (zeros on disk: no space used)."""
    run = base / "run_sparse"
    _metrics(run)
    with open(run / "events.out.tfevents.1.host", "wb") as fh:
        fh.truncate(size)
    wb = run / "wandb" / "offline-run-20240101_000000-abcd1234"
    wb.mkdir(parents=True)
    with open(wb / "run-abcd1234.wandb", "wb") as fh:
        fh.write(b":W&B" + struct.pack("<HB", 0, 0))
        fh.truncate(size * 4 // 5)
    return Attack(run)


def gzip_names(base: Path, name_len: int = 1 << 20) -> Attack:
    """A small gzip JSONL whose metric names are 1 MB each (compress to almost nothing)."""
    run = base / "run_gznames"
    _metrics(run)
    with gzip.open(run / "layers.jsonl.gz", "wt") as fh:
        for s in range(10):
            fh.write(json.dumps({"step": s, "grad_norm/" + chr(97 + s % 3) * name_len: 1.0}) + "\n")
    return Attack(run)


def shard_index(base: Path, n: int = 40000) -> Attack:
    """A safetensors shard index naming ``n`` shards that do not exist (and one path outside the run)."""
    run = base / "run_shards"
    _metrics(run)
    ck = run / "checkpoint-100"
    ck.mkdir()
    wm = {f"layer.{i}.weight": f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(n)}
    wm["escape.weight"] = "../../../../etc/passwd"
    (ck / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return Attack(run, forbidden=["root:x:0:0"])


def big_textlog(base: Path, lines: int = 10_000_000) -> Attack:
    """A generic stdout log of ``lines`` lines whose steps start again every 10,000 lines.

    ``step S loss X lr 0.001``: 1,000 segments and 20M rows at the default size (329 MB), written as one
    10,000-line block repeated (about a second).
    """
    run = base / "run_bigtext"
    run.mkdir(parents=True)
    block = "".join(f"step {s} loss {3 - s * 1e-7:.6f} lr 0.001\n" for s in range(10000)).encode()
    with open(run / "train.log", "wb") as fh:
        for _ in range(lines // 10000):
            fh.write(block)
    return Attack(run)


def slow(seconds: float) -> float:
    """A work function for the limit tests: sleeps (a run that never ends)."""
    time.sleep(seconds)
    return seconds


def hungry(nbytes: int) -> int:
    """A work function for the limit tests: holds ``nbytes`` of memory for a while."""
    block = bytearray(nbytes)
    for i in range(0, nbytes, 4096):
        block[i] = 1
    time.sleep(30)
    return len(block)


def side_links(base: Path) -> Attack:
    """Side files linked out of the run: ``checkpoint-N/trainer_state.json``, MLflow ``meta.yaml``/params/tags.

    Each target (outside the run folder) holds :data:`SECRET`; a reader that follows the link would put it
    in a report (the trainer state's ``global_step`` even decides which copy is read).
    """
    run = base / "run_side_links"
    _metrics(run)
    outside = base / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    state = {"global_step": 10 ** 6, "best_model_checkpoint": SECRET,
             "log_history": [{"step": s, "loss": 1.0, SECRET: 1.0} for s in range(1, 50)]}
    (outside / "trainer_state.json").write_text(json.dumps(state))
    (outside / "meta.yaml").write_text(f"run_name: {SECRET}\nexperiment_id: '0'\n")
    (outside / "secret.txt").write_text(SECRET)
    out = run / "output"
    (out / "checkpoint-100").mkdir(parents=True)
    (out / "trainer_state.json").write_text(json.dumps(
        {"global_step": 20, "log_history": [{"step": s, "loss": 2.0 - s * 0.01} for s in range(1, 21)]}))
    os.symlink(outside / "trainer_state.json", out / "checkpoint-100" / "trainer_state.json")
    mr = run / "mlruns" / "0" / "abc"
    for sub in ("metrics", "params", "tags"):
        (mr / sub).mkdir(parents=True)
    os.symlink(outside / "meta.yaml", mr / "meta.yaml")
    os.symlink(outside / "secret.txt", mr / "params" / "lr")
    os.symlink(outside / "secret.txt", mr / "tags" / "mlflow.note.content")
    (mr / "metrics" / "loss").write_text("".join(f"{1000 + s} {3 - s * 0.01} {s}\n" for s in range(50)))
    return Attack(run, forbidden=[SECRET], expect_skip="symlink leads out of the run folder")


def sqlite_side_view(base: Path) -> Attack:
    """``mlflow.db`` with a real ``metrics`` table, but ``runs``/``params``/``tags`` VIEWs over endless CTEs."""
    run = base / "run_sqlside"
    _metrics(run)
    con = sqlite3.connect(run / "mlflow.db")
    con.execute("CREATE TABLE metrics (key TEXT, value REAL, timestamp INTEGER, step INTEGER, is_nan INTEGER, "
                "run_uuid TEXT)")
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, 0, 'r1')",
                    [("loss", 3.0 - s * 0.01, 1000 + s, s) for s in range(50)])
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    con.execute(f"CREATE VIEW runs AS {endless}SELECT 'r1' AS run_uuid, 'n' || x AS name, 'FINISHED' AS status, "
                "x AS start_time, x AS end_time, '0' AS experiment_id FROM c")
    con.execute(f"CREATE VIEW params AS {endless}SELECT 'k' || x AS key, 'v' AS value, 'r1' AS run_uuid FROM c")
    con.execute(f"CREATE VIEW tags AS {endless}SELECT 'k' || x AS key, 'v' AS value, 'r1' AS run_uuid FROM c")
    con.commit()
    con.close()
    return Attack(run)


def surrogate_tables(base: Path) -> Attack:
    """Lone surrogates in the table readers: a W&B JSON export (key and text value), a JSONL module name."""
    run = base / "run_surrogate_tables"
    _metrics(run)
    rows = ",".join(f'{{"_step": {s}, "loss": {2.0 - s * 0.01}, "acc\\ud800": 0.5, "note": "x\\udc80"}}'
                    for s in range(40))
    (run / "history.json").write_text(f"[{rows}]")
    lines = [json.dumps({"step": s, "module": "enc.\\ud800", "absmax": 1.0 + s}).replace("\\\\ud800", "\\ud800")
             for s in range(40)]
    (run / "acts.jsonl").write_text("\n".join(lines) + "\n")
    return Attack(run)


ATTACKS = {
    "pickle_dag": pickle_dag, "pickle_memo": pickle_memo, "sqlite_view": sqlite_view, "yaml_bomb": yaml_bomb,
    "fifo_side": fifo_side, "gzip_line": gzip_line, "gzip_line_text": gzip_line_text, "bad_name": bad_name,
    "surrogates": surrogates,
    "mathtext": mathtext, "inject": inject, "symlink_out": symlink_out, "sparse_events": sparse_events,
    "gzip_names": gzip_names, "shard_index": shard_index, "big_textlog": big_textlog,
    "side_links": side_links, "sqlite_side_view": sqlite_side_view, "surrogate_tables": surrogate_tables,
}


@dataclass
class Outcome:
    """How a bounded subprocess ended: exit code (None: killed), seconds, peak tree RSS, output."""

    rc: int | None  # None: killed (time or memory)
    seconds: float
    peak_rss: int  # bytes, the largest sampled RSS of the process tree
    killed: str  # "", "time", "memory"
    stdout: bytes
    stderr: bytes


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_bounded(argv: list[str], *, timeout: float = 60.0, max_rss: int = 3 << 29, env: dict | None = None,
                cwd: str | Path | None = None) -> Outcome:
    """Run ``argv`` in its own process group; kill it past ``timeout`` s or ``max_rss`` bytes (tree RSS)."""
    import signal
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                start_new_session=True)
        peak, killed = 0, ""
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            if peak > max_rss:
                killed = "memory"
            elif time.perf_counter() - t0 > timeout:
                killed = "time"
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.05)
        seconds = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        return Outcome(None if killed else proc.returncode, seconds, peak, killed, out.read(), err.read())


_CLI = "from forensics.cli import main; main()"


def _md_html(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True, "linkify": False}).enable("table").render(text)


def problems(out: Path, streams: bytes = b"") -> list[str]:
    """What is wrong with the outputs under ``out`` (and the captured stdout/stderr ``streams``).

    Leaks (:data:`SECRET` anywhere), empty files, terminal control sequences in text outputs and
    streams, Markdown that renders (CommonMark, raw HTML allowed as a ticket tracker does) to a
    script, an image, an event handler or a ``javascript:`` link, HTML with a raw script or a bidi
    override.
    """
    found = []
    if SECRET.encode() in streams:
        found.append("secret in stdout/stderr")
    if b"\x1b" in streams or b"\x07" in streams:
        found.append("terminal escape in stdout/stderr")
    for p in sorted(x for x in out.rglob("*") if x.is_file()):
        data = p.read_bytes()
        name = p.name
        if not data:
            found.append(f"{name}: empty file")
        if SECRET.encode() in data:
            found.append(f"{name}: secret from outside the run")
        text = data.decode("utf-8", "replace")
        if name.endswith((".text", ".txt")) and ("\x1b" in text or "\x07" in text):
            found.append(f"{name}: terminal escape")
        if name.endswith((".markdown", ".md")):
            html = _md_html(text).lower()
            for bad in ("<script", "<img", 'href="javascript:', "\x1b", "\u202e"):
                if bad in html:
                    found.append(f"{name}: markdown renders {bad!r}")
            if re.search(r"<[a-z][^>]*\sonerror=", html):  # an attribute of a tag, not escaped text
                found.append(f"{name}: markdown renders 'onerror='")
        if name.endswith(".html") and ("<script>alert" in text or "\u202e" in text):
            found.append(f"{name}: raw script or bidi override in HTML")
    return found


def _measure(code_root: str, names: list[str], timeout: float, max_rss: int) -> None:
    """Print one line per attack: analyze (html+md+json+text) and audit, time and peak RSS."""
    import tempfile

    env = dict(os.environ, PYTHONPATH=code_root, FORENSICS_DEBUG="", FORENSICS_HOSTILE_SECRET=SECRET)
    py = sys.executable
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"hostile-{name}-") as tmp:
            att = ATTACKS[name](Path(tmp) / "runs")
            out = Path(tmp) / "out"
            res = []
            for fmt in ("html", "markdown", "text"):
                o = run_bounded([py, "-c", _CLI, "analyze", str(att.run), "-f", fmt, "-o", str(out / f"r.{fmt}")],
                                timeout=timeout, max_rss=max_rss, env=env, cwd=tmp)  # cwd: not this checkout
                res.append((fmt, o))
                if o.killed:
                    break
            a = run_bounded([py, "-c", _CLI, "audit", str(att.run.parent), "-o", str(out / "audit"), "--no-cache"],
                            timeout=timeout, max_rss=max_rss, env=env, cwd=tmp)
            res.append(("audit", a))
            bad = problems(out, b"".join(o.stdout + o.stderr for _, o in res))
            for what, o in res:
                state = f"killed ({o.killed})" if o.killed else f"rc {o.rc}"
                last = o.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
                print(f"{name:14} {what:8} {o.seconds:7.1f} s {o.peak_rss / 2**20:8.0f} MiB  {state:16} "
                      f"{last[0][:150]!r}", flush=True)
            print(f"{name:14} outputs: {'; '.join(sorted(set(bad)))[:600] or 'clean'}", flush=True)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("code_root")
    ap.add_argument("names", nargs="*")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--max-rss", type=float, default=2.0, help="GiB")
    a = ap.parse_args()
    _measure(a.code_root, a.names or list(ATTACKS), a.timeout, int(a.max_rss * 2**30))
