"""`oms audit`: recompute every user's money from outside and say what disagrees.

Reads PostgreSQL (`--database-url`, else OMS_DATABASE_URL, else the local mesh's
embedded database) and the admin API's ListUsers (`--gateway` and the admin key as
`oms client admin` finds them, else the local mesh's; `--database-only` skips it).
`--flat` says every order was cancelled or finished (after a kill switch, say):
nothing may be live or reserved. `--acknowledged FILE` names orders a client was told
were accepted (JSON lines: order_id, user_id, client_order_id); `--transfers FILE`
deposits and withdrawals (user_id, transfer_id, asset, amount: negative for a
withdrawal): each must be there exactly once.

Audits repeat for `--settle-s` until one is clean (the write-behind lands after the
shard). Prints the figures and every violated check with examples, or `--json`.
Exit status: 0 clean, 1 violations, 2 nothing to audit (no database, bad input).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from auditor.audit_run import AuditInputs, audit_until_settled, market_units
from auditor.core.findings import AuditReport
from auditor.core.rows import AcknowledgedOrder, AcknowledgedTransfer
from auditor.report_text import render_report, report_document
from gateway.key_command import add_admin_key_arguments, admin_client
from services.markets.catalog import MarketCatalogError, load_catalog
from services.mesh.local_mesh import LocalMesh, state_dir_of
from services.settings import SettingsError

DEFAULT_SETTLE_S = 10.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "audit",
        help="recompute every balance from transfers and fills; compare with PostgreSQL"
        " and the admin API",
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="a local mesh's folder")
    parser.add_argument("--database-url", default=None, help="env OMS_DATABASE_URL")
    parser.add_argument("--gateway", default=None, help="env OMS_GATEWAY_ADDRESS")
    add_admin_key_arguments(parser)
    parser.add_argument("--database-only", action="store_true", help="do not ask the admin API")
    parser.add_argument(
        "--markets", type=Path, default=None, help="market catalog (env OMS_MARKETS_FILE)"
    )
    parser.add_argument("--flat", action="store_true", help="nothing may be live or reserved")
    parser.add_argument("--acknowledged", type=Path, default=None, help="orders, JSON lines")
    parser.add_argument("--transfers", type=Path, default=None, help="transfers, JSON lines")
    parser.add_argument("--settle-s", type=float, default=DEFAULT_SETTLE_S)
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.set_defaults(handler=run)


def run(arguments: argparse.Namespace) -> int:
    try:
        inputs = _inputs(arguments)
    except (SettingsError, MarketCatalogError, OSError, ValueError, KeyError) as error:
        print(f"oms audit: {error}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_audit(arguments, inputs))
    except (OSError, SettingsError) as error:
        print(f"oms audit: {error}", file=sys.stderr)
        return 2
    if arguments.json:
        print(json.dumps(report_document(report), indent=2))
    else:
        print(render_report(report))
    return 0 if report.clean else 1


async def _audit(arguments: argparse.Namespace, inputs: AuditInputs) -> AuditReport:
    if arguments.database_only:
        return await audit_until_settled(inputs, settle_s=arguments.settle_s)
    async with admin_client(arguments) as admin:
        return await audit_until_settled(
            AuditInputs(
                inputs.database_url,
                inputs.markets,
                admin,
                inputs.acknowledged_orders,
                inputs.acknowledged_transfers,
                inputs.flat,
            ),
            settle_s=arguments.settle_s,
        )


def _inputs(arguments: argparse.Namespace) -> AuditInputs:
    database_url = arguments.database_url or os.environ.get("OMS_DATABASE_URL", "")
    if not database_url:
        local = LocalMesh.find(state_dir_of(arguments.state_dir))
        database_url = local.database_url if local is not None else ""
    if not database_url:
        raise SettingsError(
            "which database: --database-url or OMS_DATABASE_URL (or a local mesh's folder)"
        )
    markets_file = arguments.markets or os.environ.get("OMS_MARKETS_FILE") or None
    markets = market_units(load_catalog(Path(markets_file) if markets_file else None))
    orders = [
        AcknowledgedOrder(str(e["order_id"]), int(e["user_id"]), str(e["client_order_id"]))
        for e in _json_lines(arguments.acknowledged)
    ]
    transfers = [
        AcknowledgedTransfer(
            int(e["user_id"]), str(e["transfer_id"]), str(e["asset"]), int(e["amount"])
        )
        for e in _json_lines(arguments.transfers)
    ]
    return AuditInputs(database_url, markets, None, orders, transfers, arguments.flat)


def _json_lines(path: Path | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
