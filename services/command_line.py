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
from typing import Any

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
    ("marketdata", "services.market_data.command"),
    ("client", "gateway.client_command"),
    ("bridge", "bridge.command"),
    ("reconciler", "services.reconciler.command"),
    ("operator", "k8s.operator.command"),
    ("tls", "services.transport.command"),
    ("etcd-access", "services.coordination.access_command"),
)

# `oms --help` lists the subcommands by task, in this order: (heading, what it adds,
# subcommands). Every subcommand of SUBCOMMANDS is in exactly one group; the reference
# page docs/reference/commands.md is grouped the same way.
COMMAND_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("run a mesh on this machine", "", ("up", "infra", "demo")),
    ("trade and manage from a terminal", "", ("client",)),
    (
        "operate a mesh",
        "omsctl, a command of its own, moves users between shard clusters: the routing"
        " document, scaling and waves (omsctl --help).",
        ("status", "upgrade", "audit", "tls", "etcd-access"),
    ),
    (
        "the services (what `oms up` and the Kubernetes manifests run)",
        "Each lists the environment variables it reads at the end of its --help.",
        (
            "gateway",
            "marketdata",
            "shard",
            "matcher",
            "persister",
            "bridge",
            "reconciler",
            "operator",
        ),
    ),
    ("measure and test", "", ("bench", "sim", "chaos")),
)
DESCRIPTION = "OMS mesh: order management for a spot exchange."
EPILOG = "Every command's flags: oms COMMAND --help, or docs/reference/commands.md."


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: with a subcommand named, only that subcommand's module is
    imported (a service process loads what it runs, not every service: half a second
    of CPU at each start); otherwise every one, so that `oms --help` lists them all."""
    parser = argparse.ArgumentParser(prog="oms", description=DESCRIPTION, epilog=EPILOG)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    words = list(sys.argv[1:] if argv is None else argv)
    chosen = next((word for word in words if not word.startswith("-")), None)
    known = {name for name, _ in SUBCOMMANDS}
    for name, module_path in SUBCOMMANDS:
        if chosen in known and name != chosen:
            continue
        module = importlib.import_module(module_path)
        module.register(subparsers)
    _group_commands(parser, subparsers)
    return parser


def _group_commands(
    parser: argparse.ArgumentParser, subparsers: argparse._SubParsersAction[Any]
) -> None:
    """List the subcommands under COMMAND_GROUPS' headings, each with its own one-line
    help, instead of in one list (argparse groups arguments, not subcommands: each
    heading is an argument group holding the subcommands' entries; parsing is as before)."""
    entries = {entry.dest: entry for entry in subparsers._choices_actions}
    for heading, description, names in COMMAND_GROUPS:
        group = parser.add_argument_group(heading, description or None)
        group._group_actions.extend(entries[name] for name in names if name in entries)
    # The COMMAND positional keeps its place in the usage line only; options go last.
    parser._positionals._group_actions.remove(subparsers)
    parser._action_groups.remove(parser._optionals)
    parser._action_groups.append(parser._optionals)


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
