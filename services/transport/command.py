"""`oms tls`: make an authority and issue certificates, for a deployment without its own PKI.

    oms tls authority --out DIR                 DIR/ca.pem, DIR/ca.key
    oms tls issue --authority DIR --name shard --out DIR [--host H ...] [--client] [--days N]
                                                DIR/shard.pem, DIR/shard.key

Without `--host` the certificate is a mesh service's (its name and the mesh's,
`certificates.MESH_SERVER_NAME`), for server and client; with hosts, a server's
alone for those names (the gateway's public port: no client of the mesh), unless
`--client` (etcd's members: servers that are also clients of each other). The name
is the certificate's common name, which etcd takes as the user. The files go into
Kubernetes as Secrets (`docs/operations/tls.md`).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from services.transport.certificates import (
    CERTIFICATE_DAYS,
    Identity,
    issue,
    mesh_identity,
    new_authority,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("tls", help="make a TLS authority and issue certificates")
    verbs = parser.add_subparsers(dest="verb", required=True)
    authority = verbs.add_parser("authority", help="a new authority: ca.pem and ca.key")
    authority.add_argument("--out", type=Path, required=True)
    authority.add_argument("--name", default="OMS mesh authority")
    authority.set_defaults(handler=run_authority)
    certificate = verbs.add_parser("issue", help="a certificate from an authority")
    certificate.add_argument("--authority", type=Path, required=True, help="folder of ca.pem")
    certificate.add_argument("--name", required=True, help="the subject, e.g. shard")
    certificate.add_argument("--out", type=Path, required=True)
    certificate.add_argument("--host", action="append", default=[], dest="hosts")
    certificate.add_argument(
        "--client", action="store_true", help="with --host: for client use too (etcd's members)"
    )
    certificate.add_argument("--days", type=int, default=CERTIFICATE_DAYS)
    certificate.set_defaults(handler=run_issue)


def run_authority(arguments: argparse.Namespace) -> int:
    arguments.out.mkdir(mode=0o700, parents=True, exist_ok=True)
    new_authority(arguments.name).write(arguments.out / "ca.pem", arguments.out / "ca.key")
    print(f"{arguments.out / 'ca.pem'}, {arguments.out / 'ca.key'}")
    return 0


def run_issue(arguments: argparse.Namespace) -> int:
    authority = Identity.read(arguments.authority / "ca.pem", arguments.authority / "ca.key")
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=arguments.days)
    if arguments.hosts:
        made = issue(
            authority,
            arguments.name,
            hosts=arguments.hosts,
            not_after=until,
            server_only=not arguments.client,
        )
    else:
        made = mesh_identity(authority, arguments.name, not_after=until)
    arguments.out.mkdir(mode=0o700, parents=True, exist_ok=True)
    certificate_path = arguments.out / f"{arguments.name}.pem"
    key_path = arguments.out / f"{arguments.name}.key"
    made.write(certificate_path, key_path)
    print(f"{certificate_path}, {key_path}")
    return 0
