"""`oms operator`: the OmsCluster operator (kopf), as its Deployment runs it.

Importing this module registers the subcommand only; kopf and the Kubernetes client
are imported when the operator runs, so the other subcommands start without them.
"""

from __future__ import annotations

import argparse
from typing import Any

from services.manual.settings_help import TRANSPORT, list_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "operator", help="run the OmsCluster operator (kopf) in a Kubernetes cluster"
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="a namespace to watch (repeatable; default: POD_NAMESPACE or oms)",
    )
    parser.add_argument(
        "--liveness", default=None, help="kopf's health endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    # Named, not imported: its module imports kopf, loaded only when the operator runs.
    list_settings(parser, "k8s.operator.handlers:OperatorSettings", shared=(TRANSPORT,))
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    from k8s.operator import handlers  # noqa: PLC0415
    from services.settings import load_settings  # noqa: PLC0415
    from services.transport.tls import mesh_transport  # noqa: PLC0415

    settings = load_settings(handlers.OperatorSettings)
    # Its mesh certificate is read now, not at its first call to a shard: with TLS on
    # and a file missing, the operator stops at start naming the setting.
    mesh_transport()
    handlers.run(arguments.namespace or [settings.namespace], arguments.liveness)
    return 0
