"""`oms status`: the mesh at a glance, a row per process.

Finds the processes in the state folder `oms up` wrote, or in etcd for a deployed
mesh (`services/mesh/mesh_locator.py`).

Asks each for its `oms.v1.Status` within `--timeout-s` and prints the table
(`status_rows.py` says what each column means), or `--json`; `--watch` redraws it
every second until Ctrl-C. The exit status is 0 when every process answered and
nothing is wrong, 1 otherwise (a process missing, a lease in doubt, replicas whose
state hashes differ), 2 when no mesh was found (with `--etcd`: when etcd names none
of its processes, as for a mesh of one replica per group, which keeps nothing there:
it says so, and that `oms status` without `--etcd` asks it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from services.coordination.errors import CoordinationUnavailable
from services.mesh.mesh_locator import MeshNotFoundError, add_location_arguments, located_mesh
from services.mesh.status_probe import DEFAULT_TIMEOUT_S, probe_all
from services.mesh.status_rows import ProcessTarget, StatusRow, render_table, rows_of

WATCH_INTERVAL_S = 1.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status", help="every process of the mesh: role, term, positions, lag, hashes, health"
    )
    add_location_arguments(parser)
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--watch", action="store_true", help="redraw every second")
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run(arguments))
    return 0


async def _run(arguments: argparse.Namespace) -> int:
    try:
        async with located_mesh(arguments, "oms status") as mesh:
            return await _show(
                arguments, mesh.title, mesh.find, mesh.nothing_found, colocated=mesh.colocated
            )
    except MeshNotFoundError as error:
        print(error, file=sys.stderr)
        return 2


async def _show(
    arguments: argparse.Namespace,
    title: str,
    find: Callable[[], Awaitable[list[ProcessTarget]]],
    nothing_found: str = "no process found",
    *,
    colocated: bool = False,
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
        if all(target.service == "gateway" for target in targets):
            # Nothing of the mesh where it was looked for (the gateways were given).
            print(f"oms status: {title}: {nothing_found}", file=sys.stderr, flush=True)
            if not targets and not arguments.watch:
                if arguments.json:
                    print(json.dumps([]))
                return 2
        rows = rows_of(await probe_all(targets, arguments.timeout_s), colocated)
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
    # A persister answers only once it writes: a standby one is known by its process.
    quiet = [row for row in rows if row.service == "persister" and row.role == "standby"]
    answered = len(rows) - len(missing) - len(quiet)
    parts = [f"{answered} of {len(rows)} processes answered"]
    if quiet:
        parts.append(
            f"{len(quiet)} standby persister(s) beside follower shard replicas, alive with"
            " their replica's process (a persister listens once its replica leads)"
        )
    if wrong:
        parts.append(f"{len(wrong)} not healthy")
    return "; ".join(parts)
