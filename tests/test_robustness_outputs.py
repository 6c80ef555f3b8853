"""Outputs the way a user shares them: whole, and readable by others."""

from __future__ import annotations


def test_reports_get_the_mode_open_would_give(tmp_path) -> None:
    """An atomically written report is readable by others under the usual umask (mkstemp alone makes 0600)."""
    import os
    import stat

    from forensics import atomic

    out = tmp_path / "report.html"
    atomic.write_text(out, "<!DOCTYPE html><html></html>")
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~atomic._UMASK
    assert os.access(out, os.R_OK)


def test_an_output_that_is_a_fifo_or_a_symlink_is_written_through(tmp_path) -> None:
    """``-o FIFO`` writes into the pipe and ``-o LINK`` into the link's target: neither is replaced by a file.

    (``-o /dev/null`` or ``-o /dev/stdout`` renamed over would replace the device for every later process.)
    """
    import os
    import stat
    import threading

    from forensics import atomic

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)  # blocks if replaced
    reader.start()
    atomic.write_text(fifo, "payload")
    reader.join(10)
    assert got == [b"payload"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())

    target, link = tmp_path / "real.html", tmp_path / "link.html"
    link.symlink_to(target)
    atomic.write_text(link, "<html></html>")
    assert link.is_symlink() and target.read_text() == "<html></html>"


def test_cli_to_dev_null_keeps_the_device_and_writes_no_side_file(tmp_path) -> None:
    """``-o DEVICE`` (a character device like /dev/null): still a device, no side file beside it."""
    import os
    import stat
    from pathlib import Path

    import pytest
    from click.testing import CliRunner

    from forensics.cli import main

    run = Path(__file__).resolve().parents[1] / "sample_logs" / "lr_schedule_reset"
    dev = tmp_path / "null"  # never the real /dev/null: a regression would replace it for the whole machine
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("mknod needs root (CAP_MKNOD)")
    res = CliRunner().invoke(main, ["analyze", str(run), "-f", "json", "-o", str(dev)])
    assert res.exit_code == 1, res.output
    after = os.lstat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == os.makedev(1, 3)
    assert not (tmp_path / "null.recovery_trial.json").exists()


def test_an_unwritable_folder_is_named_not_the_temporary_file(tmp_path) -> None:
    """``-o ro/r.json`` in a read-only folder: one error naming ``ro/r.json``, never ``.r.json.*.tmp``."""
    import os
    from pathlib import Path

    import pytest
    from click.testing import CliRunner

    from forensics.cli import main

    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    run = Path(__file__).resolve().parents[1] / "sample_logs" / "lr_schedule_reset"
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    res = CliRunner().invoke(main, ["analyze", str(run), "-f", "json", "-o", str(ro / "r.json")])
    assert res.exit_code == 2 and "r.json" in res.output and ".tmp" not in res.output
