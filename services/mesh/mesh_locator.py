"""Where the tools (`oms status`, `oms upgrade`) find a mesh's processes.

In the state folder `oms up` wrote (`--state-dir`, default `OMS_STATE_DIR` or
`state/`), or with `--etcd` in etcd, as for a deployed mesh (endpoints given, or
`OMS_ETCD_ENDPOINTS`, or the local mesh's; `--mesh-id`, or `OMS_MESH_ID`, or the local
mesh's; the gateways with `--gateway`, since they keep nothing in etcd). A local mesh's
folder also gives the tools' certificate.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import DEFAULT_MESH_ID
from services.mesh.local_mesh import LocalMesh, state_dir_of
from services.mesh.status_rows import ProcessTarget
from services.mesh.status_targets import targets_in_etcd, targets_of_record


class MeshNotFoundError(Exception):
    """No mesh where the arguments say to look (the message says what to give)."""


@dataclass(frozen=True, slots=True)
class MeshLocation:
    title: str  # "mesh m1 under state/", "mesh m1 in etcd host:port"
    find: Callable[[], Awaitable[list[ProcessTarget]]]  # its processes, asked anew
    # Why `find` may find nothing there, and what to run instead (said when it does).
    nothing_found: str = "no process found"
    # Each shard replica's process runs its cluster's other roles (`oms up --colocate`).
    colocated: bool = False


def nothing_in_etcd(mesh_id: str, local: LocalMesh | None, command: str) -> str:
    """Why etcd names no process of `mesh_id`: for a local mesh of one replica per group,
    that it keeps nothing there and how to ask it instead."""
    if local is not None and local.record.mesh_id == mesh_id and not local.record.replicated:
        return (
            "this mesh runs one replica per group, on file logs: its processes keep nothing"
            f" in etcd (no replica registry, no leader keys); `{command} --state-dir"
            f" {local.state_dir}` without --etcd asks them, as its state folder names them"
        )
    return (
        f"etcd names no process of mesh {mesh_id}: is the mesh id right (--mesh-id,"
        " OMS_MESH_ID)? Only replicated groups and their leader-only roles register there;"
        " a mesh of one replica per group registers nothing"
    )


def add_location_arguments(parser: argparse.ArgumentParser) -> None:
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


@contextlib.asynccontextmanager
async def located_mesh(arguments: argparse.Namespace, command: str) -> AsyncIterator[MeshLocation]:
    """The mesh the arguments name, while the caller uses it (an etcd session stays
    open for `find`); `MeshNotFoundError` when there is none."""
    state_dir = state_dir_of(arguments.state_dir)
    local = LocalMesh.find(state_dir)
    if local is not None:
        local.adopt()  # its TLS, and the tools' etcd identity
    if arguments.etcd is None:
        if local is None:
            raise MeshNotFoundError(
                f"{command}: no mesh under {state_dir} (start one with `make run`); "
                "for a deployed mesh, --etcd"
            )
        targets = targets_of_record(local.record)

        async def recorded() -> list[ProcessTarget]:
            return targets

        name = local.record.mesh_id or "(unnamed)"
        yield MeshLocation(
            f"mesh {name} under {state_dir}",
            recorded,
            "its record names none",
            colocated=local.record.colocated,
        )
        return
    text = arguments.etcd or os.environ.get("OMS_ETCD_ENDPOINTS", "")
    endpoints = [e.strip() for e in text.split(",") if e.strip()] or list(
        local.etcd_endpoints if local is not None else ()
    )
    if not endpoints:
        raise MeshNotFoundError(
            f"{command}: --etcd without endpoints: give them, set OMS_ETCD_ENDPOINTS, or "
            "--state-dir a local mesh's folder"
        )
    mesh_id = (
        arguments.mesh_id
        or os.environ.get("OMS_MESH_ID")
        or (local.record.mesh_id if local is not None else "")
        or DEFAULT_MESH_ID
    )
    async with EtcdSession(endpoints) as session:

        async def found() -> list[ProcessTarget]:
            return await targets_in_etcd(session, mesh_id, arguments.gateway)

        yield MeshLocation(
            f"mesh {mesh_id} in etcd {','.join(endpoints)}",
            found,
            nothing_in_etcd(mesh_id, local, command),
        )
