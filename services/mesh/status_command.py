"""`oms status`: the mesh at a glance, a row per process.

Finds the processes in the state folder `oms up` wrote (`--state-dir`, default
`OMS_STATE_DIR` or `state/`), or with `--etcd` in etcd, as for a deployed mesh
(endpoints given, or `OMS_ETCD_ENDPOINTS`, or the local mesh's; `--mesh-id`, or
`OMS_MESH_ID`, or the local mesh's; the gateways with `--gateway`, since they keep
nothing in etcd). A local mesh's folder also gives the tools' certificate.

Asks each for its `oms.v1.Status` within `--timeout-s` and prints the table
(`status_rows.py` says what each column means), or `--json`; `--watch` redraws it
every second until Ctrl-C. The exit status is 0 when every process answered and
nothing is wrong, 1 otherwise (a process missing, a lease in doubt, replicas whose
state hashes differ), 2 when no mesh was found.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import DEFAULT_MESH_ID
from services.mesh.local_mesh import LocalMesh, state_dir_of
from services.mesh.status_probe import DEFAULT_TIMEOUT_S, probe_all
from services.mesh.status_rows import ProcessTarget, StatusRow, render_table, rows_of
from services.mesh.status_targets import targets_in_etcd, targets_of_record

WATCH_INTERVAL_S = 1.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status", help="every process of the mesh: role, term, positions, lag, hashes, health"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="where `oms up` runs")
    parser.add_argument(
        "--etcd",
        nargs="?",
        const="",
        default=None,
        help="find the processes in etcd (a deployed mesh): its endpoints, comma-separated"
        " (default: OMS_ETCD_ENDPOINTS, else the local mesh's etcd)",
    )
    parser.add_argument("--mesh-id", default=None, help="with --etcd (default: OMS_MESH_ID)")
    parser.add_argument(
        "--gateway", action="append", default=[], help="with --etcd: a gateway to include"
    )
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--watch", action="store_true", help="redraw every second")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run(arguments))
    return 0


async def _run(arguments: argparse.Namespace) -> int:
    state_dir = state_dir_of(arguments.state_dir)
    local = LocalMesh.find(state_dir)
    if local is not None:
        local.adopt()  # its TLS, and the tools' etcd identity
    if arguments.etcd is None:
        if local is None:
            print(
                f"oms status: no mesh under {state_dir} (start one with `make run`); "
                "for a deployed mesh, --etcd",
                file=sys.stderr,
            )
            return 2
        targets = targets_of_record(local.record)
        title = f"mesh {local.record.mesh_id or '(unnamed)'} under {state_dir}"
        return await _show(arguments, title, lambda: _fixed(targets))
    text = arguments.etcd or os.environ.get("OMS_ETCD_ENDPOINTS", "")
    endpoints = [e.strip() for e in text.split(",") if e.strip()] or list(
        local.etcd_endpoints if local is not None else ()
    )
    if not endpoints:
        print(
            "oms status: --etcd without endpoints: give them, set OMS_ETCD_ENDPOINTS, or "
            "--state-dir a local mesh's folder",
            file=sys.stderr,
        )
        return 2
    mesh_id = (
        arguments.mesh_id
        or os.environ.get("OMS_MESH_ID")
        or (local.record.mesh_id if local is not None else "")
        or DEFAULT_MESH_ID
    )
    async with EtcdSession(endpoints) as session:

        async def found() -> list[ProcessTarget]:
            return await targets_in_etcd(session, mesh_id, arguments.gateway)

        return await _show(arguments, f"mesh {mesh_id} in etcd {','.join(endpoints)}", found)


async def _fixed(targets: list[ProcessTarget]) -> list[ProcessTarget]:
    return targets


async def _show(
    arguments: argparse.Namespace,
    title: str,
    find: Callable[[], Awaitable[list[ProcessTarget]]],
) -> int:
    while True:
        try:
            targets = await find()
        except CoordinationUnavailable as error:
            # etcd itself does not answer: said, and asked again at the next redraw.
            print(f"oms status: {title}: etcd did not answer: {error}", file=sys.stderr)
            if not arguments.watch:
                return 1
            await asyncio.sleep(WATCH_INTERVAL_S)
            continue
        rows = rows_of(await probe_all(targets, arguments.timeout_s))
        healthy = all(row.health == "ok" for row in rows)
        if arguments.json:
            print(json.dumps([row.as_json() for row in rows]), flush=True)
        else:
            prefix = CLEAR_SCREEN if arguments.watch else ""
            print(f"{prefix}{title}, {time.strftime('%H:%M:%S')}\n{render_table(rows)}")
            print(_summary(rows), flush=True)
        if not arguments.watch:
            return 0 if healthy else 1
        await asyncio.sleep(WATCH_INTERVAL_S)


def _summary(rows: list[StatusRow]) -> str:
    missing = [row for row in rows if row.role == ""]
    wrong = [row for row in rows if row.role and row.health != "ok"]
    parts = [f"{len(rows) - len(missing)} of {len(rows)} processes answered"]
    if wrong:
        parts.append(f"{len(wrong)} not healthy")
    return "; ".join(parts)
