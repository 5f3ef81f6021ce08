"""`oms persister --shard-address HOST:PORT --listen HOST:PORT`: one persister per shard."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import uvloop

from persister.mesh_identity import MeshMismatchError
from persister.running import serve
from persister.settings import PersisterSettings
from services.manual.settings_help import SERVICE_SHARED, list_settings
from services.observability.logs import configure_logging
from services.observability.tracing import configure_tracing
from services.settings import load_settings


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "persister", help="run the persister of one shard (the only writer of PostgreSQL)"
    )
    parser.add_argument("--shard-address", default=None, dest="shard_address")
    parser.add_argument("--listen", default=None, help="host:port (env OMS_PERSISTER_LISTEN)")
    parser.add_argument("--database-url", default=None, dest="database_url")
    parser.add_argument("--shard-id", default=None, dest="shard_id")
    # Accepted so every service takes the same flags; the persister keeps no local state.
    parser.add_argument("--data-dir", type=Path, default=None, help=argparse.SUPPRESS)
    list_settings(parser, PersisterSettings, shared=SERVICE_SHARED)
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    settings = load_settings(
        PersisterSettings,
        overrides={
            "shard_address": arguments.shard_address,
            "listen": arguments.listen,
            "database_url": arguments.database_url,
            "shard_id": arguments.shard_id,
        },
    )
    problems = settings.problems()
    if problems:
        raise SystemExit("oms persister: " + "; ".join(problems))
    configure_logging(f"persister-{settings.shard_id}", settings.log_level)
    configure_tracing("oms-persister")
    try:
        uvloop.run(serve(settings))
    except MeshMismatchError as error:
        # One line naming both sides, not a traceback: only an operator can fix this.
        raise SystemExit(f"oms persister: {error}") from None
    return 0
