"""The long-running service (``forensics serve``) and the live follower (``forensics watch``).

Modules: :mod:`~forensics.service.app` (HTTP API and web UI), :mod:`~forensics.service.scheduler`
(the core loop), :mod:`~forensics.service.watcher` (which runs changed), :mod:`~forensics.service.worker`
(analyses in worker processes), :mod:`~forensics.service.db` (SQLite schema and migrations),
:mod:`~forensics.service.incidents`, :mod:`~forensics.service.webhooks`, :mod:`~forensics.service.metrics`,
:mod:`~forensics.service.live` (``watch``). Incremental reading is :mod:`parsers.incremental`.
"""
