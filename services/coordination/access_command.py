"""`oms etcd-access`: set a mesh's etcd users and role up, and etcd's auth on.

    oms etcd-access --user gateway --user shard ...    (OMS_ETCD_ENDPOINTS, OMS_MESH_ID)

Run as etcd's administrator: over `https://` endpoints with a certificate whose common
name is `root` (`OMS_TLS_CA`, `OMS_TLS_CERT`, `OMS_TLS_KEY`). Each `--user` is a
service certificate's common name; each gets the mesh's role, read and write over
`/oms/v1/<mesh id>/` and nothing else. It changes only what is missing, so it runs
at every deployment (the Kubernetes Job `etcd-access`); `oms up` does the same for
its embedded etcd.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from typing import Any

from services.coordination.errors import CoordinationError, CoordinationUnavailable
from services.coordination.etcd_access import grant_mesh_access
from services.coordination.etcd_endpoints import EndpointError, uses_tls
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import DEFAULT_MESH_ID
from services.manual.settings_help import TRANSPORT, list_settings
from services.settings import load_settings, setting

RETRY_S = 2.0


@dataclass(frozen=True)
class AccessSettings:
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS", default=(), help="etcd's members, https:// for TLS"
    )
    mesh_id: str = setting(env="OMS_MESH_ID", default=DEFAULT_MESH_ID, help="the mesh's id")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "etcd-access", help="give a mesh's services their etcd users and role; auth on"
    )
    parser.add_argument(
        "--user",
        action="append",
        required=True,
        dest="users",
        help="a service certificate's common name (repeat for each)",
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=120.0,
        help="how long to wait for etcd to answer before giving up",
    )
    list_settings(parser, AccessSettings, shared=(TRANSPORT,))
    parser.set_defaults(handler=run_access)


def run_access(arguments: argparse.Namespace) -> int:
    settings = load_settings(AccessSettings)
    try:
        if not settings.etcd_endpoints or not uses_tls(settings.etcd_endpoints):
            print(
                "oms etcd-access: OMS_ETCD_ENDPOINTS must be https:// (auth by certificate "
                "needs TLS)",
                file=sys.stderr,
            )
            return 2
        line = asyncio.run(_grant(settings, arguments.users, arguments.wait_s))
    except (CoordinationError, EndpointError) as error:
        print(f"oms etcd-access: {error}", file=sys.stderr)
        return 1
    print(line, flush=True)
    return 0


async def _grant(settings: AccessSettings, users: list[str], wait_s: float) -> str:
    """Grant, retrying while etcd is not up yet (a Job started beside it)."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            async with EtcdSession(settings.etcd_endpoints) as session:
                report = await grant_mesh_access(session, settings.mesh_id, users)
            break
        except CoordinationError as error:
            # Unavailable: etcd not up yet, retried; denied: the wrong certificate, at once.
            late = asyncio.get_running_loop().time() + RETRY_S > deadline
            if late or not isinstance(error, CoordinationUnavailable):
                raise
            await asyncio.sleep(RETRY_S)
    added = ", ".join(report.users_added) or "none"
    enabled = "enabled now" if report.auth_enabled_now else "already on"
    return f"role {report.role}: users added: {added}; auth {enabled}"
