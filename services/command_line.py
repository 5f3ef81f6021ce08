"""The `oms` command: one entry point for every service and tool.

Each subcommand lives with the code it runs and registers itself through a
`register(subparsers)` function; this module only knows their import paths, so
`oms --help` stays fast and a service's dependencies load only when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (subcommand, module that provides `register`)
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("up", "services.mesh.command"),
    ("infra", "services.infra.command"),
    ("matcher", "services.matcher.command"),
    ("shard", "services.shard.command"),
    ("persister", "persister.command"),
    ("demo", "services.mesh.demo"),
    ("bench", "services.bench.command"),
    ("gateway", "gateway.command"),
    ("client", "gateway.client_command"),
    ("bridge", "bridge.command"),
    ("reconciler", "services.reconciler.command"),
    ("operator", "k8s.operator.command"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oms",
        description="OMS mesh: order management for a spot exchange.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _name, module_path in SUBCOMMANDS:
        module = importlib.import_module(module_path)
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    handler = arguments.handler
    result = handler(arguments)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
