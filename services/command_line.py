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

from services.runtime.core.replica import UnsupportedVersionError
from services.settings import SettingsError
from services.transport.grpc_runtime import choose_grpc_experiments

EXIT_UNSUPPORTED_VERSION = 3  # the log or a snapshot needs a newer build

# (subcommand, module that provides `register`)
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("up", "services.mesh.command"),
    ("infra", "services.infra.command"),
    ("matcher", "services.matcher.command"),
    ("shard", "services.shard.command"),
    ("persister", "persister.command"),
    ("demo", "services.mesh.demo"),
    ("status", "services.mesh.status_command"),
    ("upgrade", "services.mesh.upgrade_command"),
    ("audit", "auditor.command"),
    ("sim", "simulation.command"),
    ("chaos", "simulation.chaos_command"),
    ("bench", "services.bench.command"),
    ("gateway", "gateway.command"),
    ("client", "gateway.client_command"),
    ("bridge", "bridge.command"),
    ("reconciler", "services.reconciler.command"),
    ("operator", "k8s.operator.command"),
    ("tls", "services.transport.command"),
    ("etcd-access", "services.coordination.access_command"),
)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: with a subcommand named, only that subcommand's module is
    imported (a service process loads what it runs, not every service: half a second
    of CPU at each start); otherwise every one, so that `oms --help` lists them all."""
    parser = argparse.ArgumentParser(
        prog="oms",
        description="OMS mesh: order management for a spot exchange.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = next((word for word in words if not word.startswith("-")), None)
    known = {name for name, _ in SUBCOMMANDS}
    for name, module_path in SUBCOMMANDS:
        if chosen in known and name != chosen:
            continue
        module = importlib.import_module(module_path)
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Before any subcommand's module loads gRPC, which reads its experiments only then.
    choose_grpc_experiments()
    parser = build_parser(argv)
    arguments = parser.parse_args(argv)
    handler = arguments.handler
    try:
        result = handler(arguments)
    except SettingsError as error:
        # A setting missing or malformed (TLS on without its files, say): one line, no
        # traceback, and the exit code of bad usage.
        print(f"oms {arguments.command}: {error}", file=sys.stderr)
        return 2
    except BaseException as error:
        # A replica whose build cannot decide under the log's state-machine version
        # stops before applying it: one line naming both versions, its own exit code.
        # (It reaches here inside the task groups' exception groups.)
        unsupported = _found_in(error, UnsupportedVersionError)
        if unsupported is None:
            raise
        print(f"oms {arguments.command}: {unsupported}", file=sys.stderr)
        return EXIT_UNSUPPORTED_VERSION
    return int(result or 0)


def _found_in(error: BaseException, kind: type[Exception]) -> BaseException | None:
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _found_in(inner, kind)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main())
