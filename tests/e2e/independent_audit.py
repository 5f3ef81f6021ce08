"""The independent money auditor (`auditor/`, `oms audit`) in the end-to-end tests.

`invariants.py` reads the services' internals (actors, shard books, matcher indexes);
this reads what the auditor reads, PostgreSQL and the admin API, and recomputes every
balance from the transfers and fills with the auditor's own arithmetic. Every mesh
check runs both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from auditor.audit_run import AuditInputs, audit_until_settled, market_units
from auditor.core.findings import AuditReport
from auditor.core.rows import AcknowledgedOrder, AcknowledgedTransfer
from auditor.report_text import render_report
from gateway.client import AdminClient
from services.markets.catalog import load_catalog
from tests.e2e.gateway_load import PlacedOrder

MARKETS = market_units(load_catalog())
SETTLE_S = 30.0
PAGE_USERS = 1_000


def acknowledged_orders(placed: Iterable[PlacedOrder]) -> list[AcknowledgedOrder]:
    return [
        AcknowledgedOrder(p.ack.order_id, p.user_id, p.client_order_id)
        for p in placed
        if p.ack.accepted
    ]


async def audit_from_outside(
    database_url: str,
    *,
    admin: AdminClient | None = None,
    placed: Iterable[PlacedOrder] = (),
    transfers: Iterable[AcknowledgedTransfer] = (),
    flat: bool = False,
    settle_s: float = SETTLE_S,
    expected: Mapping[str, int] | None = None,
) -> AuditReport:
    """The auditor, repeated until clean within `settle_s`; fails with its report if not.
    `expected`: violations a test caused on purpose (by check), which must be found."""
    inputs = AuditInputs(
        database_url, MARKETS, admin, acknowledged_orders(placed), tuple(transfers), flat
    )
    report = await audit_until_settled(inputs, settle_s=settle_s, expected=expected)
    assert report.counts == dict(expected or {}), render_report(report)
    print(render_report(report))  # shown with -s: what was recomputed and compared
    return report


async def cancel_everything(admin: AdminClient) -> int:
    """The kill switch on for every user (what rests is cancelled, nothing new is taken):
    the mesh becomes flat. Returns how many users."""
    users = 0
    after = 0
    while True:
        page = await admin.list_users(after_user_id=after, limit=PAGE_USERS)
        for user in page.users:
            ack = await admin.kill_switch(user.user_id, enable=True)
            assert ack.accepted, (user.user_id, ack)
            users += 1
        if not page.more or not page.users:
            return users
        after = page.users[-1].user_id
