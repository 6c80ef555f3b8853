"""Real, published training logs (a small redistributable set, provenance in its README.md) are read, objective found.

The set lives outside the repository (logs fetched from other people's repositories are not committed
here): ``$FORENSICS_REAL_SMALL``, else ``../shared/realruns-small`` beside the checkout, else
``/work/realcorpus/small``; without any of them these tests skip with a reason. Each folder there is one
run copied byte for byte from a public repository whose licence allows redistribution (BSD, MIT,
Apache-2.0). Every run must be read (at least one metric record) and its training objective found:
``loss`` itself, or for a run whose objective is a sum of parts (GAN generator terms, YOLO box/cls/dfl) a
``loss`` or ``loss/<part>`` series with one part name (issue 13: parts map to ``loss/<part>``; a flattened
``loss/G/loss/num`` is a sample count, not a loss part).

Runs today's reader fails are marked ``xfail(strict=True)`` with what fails: a general reader that reads
them turns the mark into an unexpected pass, and the mark is then removed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from forensics.api import load
from forensics.errors import InputError


def _real_small() -> Path | None:
    env = os.environ.get("FORENSICS_REAL_SMALL")
    cands = [Path(env)] if env else [Path(__file__).resolve().parents[2] / "shared" / "realruns-small",
                                     Path("/work/realcorpus/small")]
    return next((c for c in cands if c.is_dir()), None)


REAL = _real_small()


@pytest.fixture
def real() -> Path:
    """The small real-run set; skips the test when it is absent."""
    if REAL is None:
        pytest.skip("small real-run set not found ($FORENSICS_REAL_SMALL, ../shared/realruns-small, "
                    "/work/realcorpus/small)")
    return REAL


EXACT = "loss"  # the series named loss must be read
FAMILY = "loss-family"  # loss, or loss/<part> for an objective that is a sum of named parts

# run folder -> (objective expected, why today's reader fails it or None)
RUNS: dict[str, tuple[str, str | None]] = {
    "cs336_smoke_train_log": (EXACT, None),
    "mmengine_mmdet_pkurnikov": (EXACT, None),
    "nanogpt_seis_mix": (EXACT, None),
    "edm_cortical_thickness": (
        EXACT, "EDM stats.jsonl {'Loss/loss': {'num', 'mean', 'std'}, ...} is read as 'Loss/loss/mean', "
        "'Loss/loss/num', ... : the objective is not named loss (no rule for a '<name>/mean' of a stats dict)"),
    "stylegan_rpg_sprites": (
        FAMILY, "StyleGAN2-ADA stats.jsonl is read, but its {num, mean, std} dicts are flattened into names: "
        "'loss/G/loss/mean', 'loss/G/loss/num' (a count), 'loss/scores/fake/std', ...: no loss or loss/<part>"),
    "lightning_genrisk_gan_v0_nan": (
        FAMILY, "Lightning GAN metrics.csv: train_gen_loss / train_disc_loss are kept as raw names; no loss "
        "or loss/<part> series"),
    "lightning_genrisk_gan_v6": (FAMILY, "as genrisk v0: train_gen_loss / train_disc_loss not mapped"),
    "parameter_golf_seed1337": (
        EXACT, "Parameter Golf (modded-nanogpt style) 'step:1/20000 train_loss:6.9317 train_time:143ms' is "
        "taken for torchtitan and every line rejected: 'torchtitan metric line that does not parse'; 0 records"),
    "paddlevit_cait_xxs24": (
        EXACT, "PaddleViT log_train.txt 'Epoch[001/100], Step[0000/0196], Avg Loss: 0.9829, Avg Acc: 0.7930' "
        "after a YAML config dump is not read: 0 records"),
    "parameter_golf_naive_baseline": (EXACT, "as parameter_golf_seed1337 (record folder's train.log): 0 records"),
    "cyclegan_masilab_horse2zebra": (
        FAMILY, "pytorch-CycleGAN loss_log.txt '(epoch: 1, iters: 100, time: ..) D_A: 0.540 G_A: 0.433 ...' is not "
        "read: 0 records (no text-log shape for '(k: v, ...) k: v k: v' lines after a '=== Training Loss' banner)"),
    "cyclegan_masilab_del": (FAMILY, "pytorch-CycleGAN loss_log.txt not read (0 records), as horse2zebra"),
    "cyclegan_masilab_mxifAll2he_no_flip_256": (
        FAMILY, "pytorch-CycleGAN loss_log.txt not read (0 records): one loss line among seven launch banners"),
    "cyclegan_vva_root": (FAMILY, "pytorch-CycleGAN loss_log.txt (444 KB, several launches) not read (0 records)"),
    "ultralytics_dental_tooth": (
        FAMILY, "Ultralytics YOLOv8 results.csv (epoch,train/box_loss,train/cls_loss,train/dfl_loss,...) is not "
        "recognised as a metrics table: 'no training logs found'"),
    "yolox_s_mlu": (
        EXACT, "YOLOX loguru train_log.txt 'epoch: 1/300, iter: 10/1849, mlu mem: ..Mb, ... total_loss: 10.7, "
        "iou_loss: ..' is not read: 0 records (the 'iter: N/M' fraction inside 'epoch: N/M' is not a step it knows)"),
}


def _params() -> list:
    out = []
    for name, (kind, why) in sorted(RUNS.items()):
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        out.append(pytest.param(name, kind, marks=marks, id=name))
    return out


def test_every_folder_is_listed_with_provenance(real: Path) -> None:
    """Each run folder is in RUNS and in the README's provenance table, and the set stays small."""
    folders = sorted(p.name for p in real.iterdir() if p.is_dir())
    assert folders == sorted(RUNS), f"{real} folders and RUNS differ"
    readme = (real / "README.md").read_text()
    for name in folders:
        assert f"`{name}`" in readme, f"{name} has no provenance row in {real}/README.md"
    total = sum(f.stat().st_size for f in real.rglob("*") if f.is_file())
    assert total < 20 * 2**20, f"{real} holds {total} bytes (limit 20 MB)"


@pytest.mark.parametrize(("name", "kind"), _params())
def test_real_run_read_with_objective(real: Path, name: str, kind: str) -> None:
    """The run is read (records > 0) and its training objective is among the series read."""
    try:
        run = load(real / name)
    except InputError as e:
        pytest.fail(f"{name} not read: {e}")
    assert run.metrics.height > 0, f"{name}: no metric record read"
    names = run.metric_names
    if kind == EXACT:
        assert "loss" in names, f"{name}: no 'loss' series among {names}"
    else:
        assert any(re.fullmatch(r"loss(/[^/]+)?", n) for n in names), (
            f"{name}: no 'loss' or 'loss/<part>' series among {names}")
