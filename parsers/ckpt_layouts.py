"""Checkpoint layouts recognised by their file names and checked for completeness, not decoded.

A sharded checkpoint's index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``) names
its shards: a missing one is listed with the tensors it held. A torch.distributed checkpoint
(``*.distcp``) is complete when its ``.metadata`` is there (a pickle of torch classes: never read). A
DeepSpeed ZeRO checkpoint (``mp_rank_XX_model_states.pt``, ``zero_pp_rank_D_mp_rank_XX_optim_states.pt``)
is complete when every data-parallel x model-parallel partition is (docs/formats.md#dcp,
docs/formats.md#deepspeed-zero).

Each check returns :data:`Problem` tuples ``(what, why, incomplete)``: ``what`` relative to the run folder,
``why`` the one-line reason, ``incomplete`` whether it makes the checkpoint unfit to resume from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from parsers import file_policy
from parsers.file_policy import is_readable_file
from parsers.tensors import CheckpointError

Problem = tuple[str, str, bool]
DS_MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
MAX_LISTED = 20
"""Missing shards listed one by one; the rest in one entry."""


def read_index(index: str | Path) -> tuple[dict[str, str], list[str]]:
    """A sharded checkpoint's index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``).

    Args:
        index: The index file.

    Returns:
        ``(weight_map, missing)``: tensor name -> shard file name, and the shard files the index
        lists that are not in its folder.

    Raises:
        CheckpointError: The index is not JSON or has no ``weight_map``.
    """
    index = Path(index)
    try:
        obj = json.loads(index.read_text(encoding="utf-8"))
        wmap = {str(k): str(v) for k, v in obj["weight_map"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"unreadable index: {type(exc).__name__}: {exc}") from None
    # a shard is a file name in the index's folder: a name with a path in it ("../../etc/passwd") is never
    # looked up (that would tell which paths outside the run exist) and counts as missing
    shards = set(wmap.values())
    missing = sorted(s for s in shards if "/" in s or "\\" in s or s in ("", ".", "..")
                     or not is_readable_file(index.parent / s))
    return wmap, missing



def index_problems(index: Path, root: Path) -> list[Problem]:
    """The shards an index lists that are missing, each with the tensors it held (see :func:`read_index`).

    Raises:
        CheckpointError: The index is not JSON or has no ``weight_map``.
    """
    wmap, missing = read_index(index)
    by_shard: dict[str, list[str]] = {}
    for t, s in wmap.items():  # one pass: a crafted index naming 40k missing shards stays linear
        by_shard.setdefault(s, []).append(t)
    out: list[Problem] = []
    for shard in missing[:MAX_LISTED]:
        lost = by_shard[shard]
        out.append((f"{index.parent.relative_to(root).as_posix()}/{file_policy.display(shard)}",
                    f"shard listed in {index.name} is missing: {len(lost)} tensors not read "
                    f"({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''})", True))
    if len(missing) > MAX_LISTED:
        rest = sum(len(by_shard[s]) for s in missing[MAX_LISTED:])
        out.append((index.relative_to(root).as_posix(), f"{len(missing) - MAX_LISTED} more shards listed in "
                    f"{index.name} are missing: {rest} more tensors not read", True))
    return out


def dcp_problems(rel: str, folder: Path, n_distcp: int) -> list[Problem]:
    """A torch.distributed checkpoint of ``n_distcp`` ``.distcp`` files in ``folder``: complete or not."""
    if not (folder / ".metadata").is_file():
        return [(rel, "incomplete torch.distributed checkpoint: no .metadata (the save did not finish); "
                 "never resume from it", True)]
    return [(rel, f"torch.distributed checkpoint ({n_distcp} .distcp files): complete, tensors not decoded "
             "(its .metadata is a pickle of torch classes)", False)]


def deepspeed_problems(rel: str, ds_model: list[int], ds_optim: list[tuple[int, int]]) -> list[Problem]:
    """The partitions a DeepSpeed checkpoint lacks (model-parallel ranks, data x model optimizer partitions)."""
    dp = sorted({d for d, _ in ds_optim})
    mps = sorted({m for _, m in ds_optim} | set(ds_model))
    gaps = [f"mp_rank_{m:02d}_model_states.pt" for m in mps if m not in ds_model]
    gaps += [f"zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for m in mps
             for d in range(max(dp, default=-1) + 1) if (d, m) not in ds_optim]
    out: list[Problem] = [(f"{rel}/{g}", "DeepSpeed checkpoint file missing (incomplete save or lost rank)", True)
                          for g in gaps]
    if ds_optim:
        out.append((rel, f"DeepSpeed ZeRO optimizer state: {len(dp)} data-parallel x {len(mps)} model-parallel "
                    "partitions (flat fp32 partitions, not decoded)", False))
    return out
