"""A gateway cut from its shard by the kernel answers every request within its deadline.

The gateway's packets to the shard's port are dropped by nftables (`LinkCut`: its
own cgroup, one-way; the bridge, the persister and the test still reach the shard).
Nothing fails fast: the gateway's connection stays up and simply hears nothing, as
behind a firewall that drops. What the client contract promises, seen:

- every unary place and every request of a Trade stream is answered within the
  gateway's request deadline (here 2 s) and a margin, UNAVAILABLE or TIMEOUT, never
  left hanging;
- healed, the same requests sent again with the same client order ids are each
  placed exactly once: some of those sent during the cut reached the shard late, when
  TCP delivered what it had kept retransmitting, and are answered as duplicates;
- the mesh's invariants hold and the auditor finds the flat mesh clean.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gateway.client import GatewayCallError, OmsClient
from protos.oms.v1 import common_pb2, gateway_pb2
from tests.e2e.gateway_load import PlacedOrder
from tests.e2e.independent_audit import audit_from_outside, cancel_everything
from tests.e2e.invariants import check_full_mesh
from tests.full_mesh import FullMesh, running_mesh
from tests.gateway.accounts import BTC, open_account
from tests.partitions.nft_partition import LinkCut, unavailable

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=f"partitions: {unavailable()}"),
]
DEADLINE_S = 2.0
MARGIN_S = 1.0  # the client's own path: a loaded machine
STREAM_ORDERS = 200
RETRYABLE = ("UNAVAILABLE", "TIMEOUT")


@pytest.fixture
def mesh(tmp_path: Path, database_url: str) -> Iterator[FullMesh]:
    """The conftest's mesh, its gateway's deadline short."""
    deadline = {"OMS_GATEWAY_REQUEST_DEADLINE_MS": str(int(DEADLINE_S * 1000))}
    with running_mesh(tmp_path / "mesh", database_url, gateway_environment=deadline) as mesh:
        yield mesh


def bid(client: OmsClient, client_order_id: str) -> gateway_pb2.PlaceOrderRequest:
    return client.place_request(
        client_order_id, BTC, common_pb2.SIDE_BUY, price_ticks=6_000_000, quantity_lots=1
    )


async def test_a_gateway_cut_from_its_shard_answers_within_its_deadline(mesh: FullMesh) -> None:
    async with mesh.admin() as admin:
        account = await open_account(admin, {"USDT": 10**12})
    shard_port = int(mesh.shard.address.rpartition(":")[2])
    async with account.client(mesh.gateway.address, timeout_s=30.0) as client:
        before = await client.place_order(bid(client, "before"))
        assert before.accepted, before
        with LinkCut([shard_port]) as cut:
            # The gateway again, in the cut's cgroup (its sockets will be), then cut.
            await asyncio.to_thread(cut.restart_inside, mesh.gateway)
            await until_placed(client, [bid(client, "restarted")])
            cut.drop()
            started = time.monotonic()
            with pytest.raises(GatewayCallError) as refused:
                await client.place_order(bid(client, "unary-during"))
            unary_s = time.monotonic() - started
            assert refused.value.reason.removeprefix("GATEWAY_ERROR_REASON_") in RETRYABLE, (
                refused.value
            )
            assert unary_s < DEADLINE_S + MARGIN_S, unary_s

            requests = [bid(client, f"stream-{n}") for n in range(STREAM_ORDERS)]
            async with client.trade() as stream:
                started = time.monotonic()
                answers = await stream.submit(requests, timeout_s=DEADLINE_S + MARGIN_S)
                stream_s = time.monotonic() - started
            reasons = {
                gateway_pb2.GatewayErrorReason.Name(a.error.reason).removeprefix(
                    "GATEWAY_ERROR_REASON_"
                )
                for a in answers
            }
            assert all(a.WhichOneof("response") == "error" for a in answers), answers[:3]
            assert reasons <= set(RETRYABLE), reasons
            assert stream_s < DEADLINE_S + MARGIN_S, stream_s
            print(
                f"cut: unary answered in {unary_s:.2f} s, {STREAM_ORDERS} stream requests in"
                f" {stream_s:.2f} s, {sorted(reasons)}"
            )  # shown with -s
            cut.heal()

        # Healed: everything again, same ids. Each is placed once.
        placed = [PlacedOrder(account.user_id, "before", BTC, before)]
        restarted = await client.place_order(bid(client, "restarted"))  # a duplicate now
        placed.append(PlacedOrder(account.user_id, "restarted", BTC, restarted))
        again = [bid(client, "unary-during"), *requests]
        acks = await until_placed(client, again)
        duplicates = sum(ack.duplicate for ack in acks)
        print(f"healed: {len(acks)} placed, {duplicates} of them already there")
        ids = [ack.order_id for ack in acks]
        assert len(set(ids)) == len(ids) == STREAM_ORDERS + 1
        placed += [
            PlacedOrder(account.user_id, r.client_order_id, BTC, ack)
            for r, ack in zip(again, acks, strict=True)
        ]
    await check_full_mesh(mesh, [p.ack.order_id for p in placed])
    async with mesh.admin() as admin:
        await cancel_everything(admin)
        await audit_from_outside(mesh.database_url, admin=admin, placed=placed, flat=True)


async def until_placed(
    client: OmsClient, requests: list[gateway_pb2.PlaceOrderRequest]
) -> list[gateway_pb2.OrderAck]:
    """Each request sent again until it has an accepted answer (the link may take a
    moment to recover once healed; sent back to back, they meet the user's rate limit)."""
    deadline = time.monotonic() + 60.0
    acks: list[gateway_pb2.OrderAck] = []
    for request in requests:
        while True:
            try:
                ack = await client.place_order(request)
            except GatewayCallError as error:
                assert error.code in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ), error
                assert time.monotonic() < deadline, error
                await asyncio.sleep(0.1)
                continue
            if not ack.accepted and ack.retryable:  # RATE_LIMITED: as the contract says
                assert time.monotonic() < deadline, ack
                await asyncio.sleep(0.1)
                continue
            assert ack.accepted, ack
            acks.append(ack)
            break
    return acks
