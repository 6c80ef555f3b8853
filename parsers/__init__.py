"""One module per source format, each with ``FORMAT``, ``sniff(path)`` and ``read(path, root)``.

The dispatch order is the explicit tuple :data:`PARSER_MODULES` (first module whose ``sniff``
says yes reads the file). :func:`parsers.discover.load_run` walks a run folder with it.

Parser contract (every module listed below):

- ``FORMAT: str`` -- the format name written in ``sources[].format``.
- ``sniff(path: pathlib.Path) -> bool`` -- cheap check by name and first bytes; never raises.
- ``read(path: pathlib.Path, root: pathlib.Path) -> forensics.model.ParseResult`` -- reads every
  complete record; damage becomes ``Skip`` entries; raises only ``forensics.errors.ParseError``
  when nothing in the file is usable. ``source`` columns hold ``path`` relative to ``root``.
"""

from __future__ import annotations

import forensics  # noqa: F401 - first: its allocator setting (Arrow's system pool) precedes any Arrow buffer

PARSER_MODULES: tuple[str, ...] = (
    "parsers.tensorboard",   # events.out.tfevents.*
    "parsers.hf_trainer",    # trainer_state.json (log_history)
    "parsers.wandb_run",     # W&B run-*.wandb transaction logs (+ their side files)
    "parsers.jsonl",         # *.jsonl metric logs
    "parsers.csv_metrics",   # W&B history exports, Lightning metrics.csv
    "parsers.mlflow_store",  # MLflow file store metrics/<key> files, mlflow.db SQLite store
    "parsers.textlog",       # Megatron-LM / DeepSpeed / HF stdout / fairseq / metaseq / generic stdout
)
