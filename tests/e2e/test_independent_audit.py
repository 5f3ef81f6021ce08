"""`oms audit` against a real mesh: clean after trading, and each tampering of PostgreSQL
found and named by the check it breaks.

Alice buys 3 lots of BTC-USDT from Bob, who rests them; Bob withdraws part of what he
received and is restarted (flushed to PostgreSQL and dropped from memory), so the
auditor compares a resident user with her shard's answer and a stored one with his
row. Then the tables are changed behind the mesh's back, one at a time, as a bug or
an intruder would.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from auditor.core.rows import AcknowledgedTransfer
from protos.oms.v1 import common_pb2
from services.command_line import main
from tests.e2e.gateway_load import PlacedOrder
from tests.e2e.independent_audit import audit_from_outside
from tests.full_mesh import FullMesh
from tests.gateway.accounts import BTC, PRICE, open_account
from tests.gateway.gateway_process import ADMIN_KEY, ADMIN_SECRET

NewMesh = Callable[..., Awaitable[FullMesh]]
LOTS = 3
AUDIT_RUNS = itertools.count()
ALICE_USDT = 50_000_000_000
BOB_BTC = 10_000_000
BOB_OUT = 1_000_000


async def oms_audit(mesh: FullMesh, folder: Path, *options: str) -> tuple[int, dict[str, Any]]:
    """`oms audit --json` in a thread (it runs its own event loop): exit status and report."""
    output = folder / f"audit-{next(AUDIT_RUNS)}.json"
    arguments = [
        "audit",
        "--database-url",
        mesh.database_url,
        "--gateway",
        mesh.gateway.address,
        "--admin-key",
        ADMIN_KEY,
        "--admin-secret",
        ADMIN_SECRET,
        "--json",
        *options,
    ]

    def run() -> int:
        with output.open("w") as out, contextlib.redirect_stdout(out):
            return main(arguments)

    code = await asyncio.to_thread(run)
    return code, json.loads(output.read_text())


async def test_oms_audit_is_clean_then_names_each_tampering(
    new_mesh: NewMesh, tmp_path: Path
) -> None:
    mesh = await new_mesh()
    async with mesh.admin() as admin:
        alice = await open_account(admin, {"USDT": ALICE_USDT})
        bob = await open_account(admin, {"BTC": BOB_BTC})
        placed: list[PlacedOrder] = []
        async with bob.client(mesh.gateway.address) as client:
            ack = await client.place("bob-1", BTC, common_pb2.SIDE_SELL, price_ticks=PRICE,
                                     quantity_lots=LOTS)  # fmt: skip
            assert ack.accepted, ack
            placed.append(PlacedOrder(bob.user_id, "bob-1", BTC, ack))
        async with alice.client(mesh.gateway.address) as client:
            ack = await client.place("alice-1", BTC, common_pb2.SIDE_BUY, price_ticks=PRICE,
                                     quantity_lots=LOTS)  # fmt: skip
            assert ack.accepted, ack
            placed.append(PlacedOrder(alice.user_id, "alice-1", BTC, ack))
        transfers = [
            AcknowledgedTransfer(alice.user_id, f"fund-{alice.user_id}-USDT", "USDT", ALICE_USDT),
            AcknowledgedTransfer(bob.user_id, f"fund-{bob.user_id}-BTC", "BTC", BOB_BTC),
            AcknowledgedTransfer(bob.user_id, "bob-out", "USDT", -BOB_OUT),
        ]
        # Both sides settled (the auditor's own figures say so), then Bob withdraws and
        # leaves memory.
        report = await audit_from_outside(
            mesh.database_url, admin=admin, placed=placed, transfers=transfers[:2], flat=True
        )
        assert (report.figures["trades"], report.figures["fills"]) == (1, 2), report.figures
        assert (await admin.withdraw(bob.user_id, "USDT", BOB_OUT, "bob-out")).accepted
        assert (await admin.restart_user(bob.user_id)).accepted
        await audit_from_outside(
            mesh.database_url, admin=admin, placed=placed, transfers=transfers, flat=True
        )

    acknowledged = tmp_path / "acknowledged.jsonl"
    acknowledged.write_text(
        "".join(
            json.dumps(
                {
                    "order_id": p.ack.order_id,
                    "user_id": p.user_id,
                    "client_order_id": p.client_order_id,
                }
            )
            + "\n"
            for p in placed
        )
    )
    transfer_file = tmp_path / "transfers.jsonl"
    transfer_file.write_text(
        "".join(
            json.dumps(
                {
                    "user_id": t.user_id,
                    "transfer_id": t.transfer_id,
                    "asset": t.asset,
                    "amount": t.amount,
                }
            )
            + "\n"
            for t in transfers
        )
    )
    given = ["--flat", "--acknowledged", str(acknowledged), "--transfers", str(transfer_file)]
    code, document = await oms_audit(mesh, tmp_path, *given)
    assert (code, document["violations"]) == (0, {}), document
    figures = document["figures"]
    assert figures["users"] == 2 and figures["withdrawals"] == 1, figures
    assert figures["answered_users_compared"] == 2, figures
    assert figures["stored_users_compared"] == 1, figures  # Bob, restarted
    assert figures["acknowledged_orders"] == 2, figures

    alice_order = placed[1].ack.order_id
    tamperings: list[tuple[str, str, list[Any], set[str]]] = [
        (
            "UPDATE fills SET fee = fee + 1 WHERE order_id = $1",
            "UPDATE fills SET fee = fee - 1 WHERE order_id = $1",
            [alice_order],
            {"fill-fee", "fees-account", "ledger-user", "answered-balance"},
        ),
        (
            "UPDATE balances SET total = total + 1 WHERE user_id = $1 AND asset = 'USDT'",
            "UPDATE balances SET total = total - 1 WHERE user_id = $1 AND asset = 'USDT'",
            [bob.user_id],
            # The admin API answers for a user no shard holds from the user's state bytes,
            # not from this readable copy: only the copy is wrong.
            {"stored-balance"},
        ),
        (
            "UPDATE orders SET filled_lots = 2, status = 2 WHERE order_id = $1",
            "UPDATE orders SET filled_lots = 3, status = 4 WHERE order_id = $1",
            [alice_order],
            {"order-fills", "order-final"},
        ),
        (
            "UPDATE orders SET client_order_id = 'alice-9' WHERE order_id = $1",
            "UPDATE orders SET client_order_id = 'alice-1' WHERE order_id = $1",
            [alice_order],
            {"acknowledged-order"},
        ),
        (
            "UPDATE fills SET price_ticks = price_ticks + 1 WHERE order_id = $1",
            "UPDATE fills SET price_ticks = price_ticks - 1 WHERE order_id = $1",
            [alice_order],
            # Above Alice's limit, unlike Bob's side; her money recomputed differs.
            {"fill-price", "trade-pair", "ledger-user", "answered-balance"},
        ),
    ]
    connection = await asyncpg.connect(mesh.database_url)
    try:
        for tamper, restore, values, checks in tamperings:
            await connection.execute(tamper, *values)
            code, document = await oms_audit(mesh, tmp_path, *given, "--settle-s", "0")
            assert (code, set(document["violations"])) == (1, checks), (tamper, document)
            await connection.execute(restore, *values)
        code, document = await oms_audit(mesh, tmp_path, *given, "--settle-s", "0")
        assert (code, document["violations"]) == (0, {}), document
        # A fill lost: its trade has one side, Alice's order more filled than its fills,
        # her money and the fee account more than the fills make.
        await connection.execute("DELETE FROM fills WHERE order_id = $1", alice_order)
        code, document = await oms_audit(mesh, tmp_path, *given, "--settle-s", "0")
        assert (code, set(document["violations"])) == (
            1,
            {"trade-pair", "order-fills", "ledger-user", "answered-balance", "fees-account"},
        ), document
    finally:
        await connection.close()
