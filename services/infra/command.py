"""`oms infra up|down|status`: the local etcd and PostgreSQL every service and test uses."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path

from services.infra.errors import InfraError
from services.infra.local_infra import LocalInfra, ServerState, ServerStatus
from services.infra.settings import InfraSettings
from services.manual.settings_help import list_settings
from services.settings import SettingsError, load_settings

# `oms infra status` exits with this when something is down, as `pg_ctl status` does.
EXIT_NOT_RUNNING = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    infra = subparsers.add_parser(
        "infra",
        help="start, stop or inspect the local etcd and PostgreSQL",
        description=(
            "Run etcd and PostgreSQL as background processes with data under the state "
            "folder. OMS_ETCD_ENDPOINTS / OMS_DATABASE_URL point at existing servers instead."
        ),
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="folder for data, logs and infra.json (default: $OMS_STATE_DIR, else ./state)",
    )
    list_settings(infra, InfraSettings)
    actions = infra.add_subparsers(dest="infra_action", required=True, metavar="ACTION")
    for name, help_text, handler in (
        ("up", "start what is not running yet (idempotent)", run_up),
        ("down", "stop the servers `up` started", run_down),
        ("status", f"show each server; exit {EXIT_NOT_RUNNING} if any is down", run_status),
    ):
        action = actions.add_parser(name, help=help_text, parents=[common])
        list_settings(action, InfraSettings)
        action.set_defaults(handler=handler)


def run_up(arguments: argparse.Namespace) -> int:
    return _run("up", arguments, lambda infra: (infra.up(), infra.status())[1])


def run_down(arguments: argparse.Namespace) -> int:
    return _run("down", arguments, LocalInfra.down)


def run_status(arguments: argparse.Namespace) -> int:
    return _run("status", arguments, LocalInfra.status, exit_code_for=_status_exit_code)


def format_status(status: ServerStatus) -> str:
    """One readable line, e.g. `etcd       running  127.0.0.1:2379  pid 12  (embedded, ...)`."""
    endpoint = status.endpoint if status.state is not ServerState.STOPPED else None
    parts = [f"{status.name:<10} {status.state.value:<8} {_without_password(endpoint or '-')}"]
    if status.pid is not None:
        parts.append(f"pid {status.pid}")
    detail = status.source
    if status.data_dir is not None:
        detail += f", data {_display_path(status.data_dir)}"
    parts.append(f"({detail})")
    return "  ".join(parts)


def _run(
    action: str,
    arguments: argparse.Namespace,
    perform: Callable[[LocalInfra], list[ServerStatus]],
    exit_code_for: Callable[[Iterable[ServerStatus]], int] = lambda _: 0,
) -> int:
    try:
        settings = load_settings(InfraSettings, overrides={"state_dir": arguments.state_dir})
        statuses = perform(LocalInfra.from_settings(settings))
    except (InfraError, SettingsError) as error:
        print(f"oms infra {action}: {error}", file=sys.stderr)
        return 1
    for status in statuses:
        print(format_status(status))
    return exit_code_for(statuses)


def _status_exit_code(statuses: Iterable[ServerStatus]) -> int:
    healthy = {ServerState.RUNNING, ServerState.EXTERNAL}
    return 0 if all(status.state in healthy for status in statuses) else EXIT_NOT_RUNNING


def _without_password(endpoint: str) -> str:
    # OMS_DATABASE_URL may carry a password; status output ends up in terminals and CI logs.
    parts = urllib.parse.urlsplit(endpoint)
    if not parts.password:
        return endpoint
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
