"""Every order a load got acknowledged exists exactly once: in the shard, PostgreSQL, its matcher.

Checked from outside after a fault, once the mesh is quiet:
- per user, the acknowledged order ids are exactly `s1:<user>:1..n` and the shard's
  `user_seq` is n: no retry consumed a second sequence number;
- PostgreSQL holds exactly the acknowledged orders of the load's users, each under the
  client order id it was acknowledged for: nothing lost, nothing created twice;
- each order is known to the matcher group of its symbol and ends there in the state
  PostgreSQL records (status, lots left) when it is finished;
- the matcher's event stream for the shard accepted or rejected each order once: the
  bridge's re-drives were deduplicated, none reached a book twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager

import asyncpg

from protos.oms.v1 import matcher_pb2
from tests.e2e.gateway_load import GROUP_OF, PlacedOrder
from tests.e2e.invariants import TERMINAL
from tests.full_mesh import FullMesh
from tests.matcher_service.matcher_client import MatcherClient
from tests.persister.persister_client import PersisterClient
from tests.service_process import aio_channel
from tests.shard_service.shard_client import ShardClient

AGREE_TIMEOUT_S = 15.0
QUERY_CHUNK = 200


async def check_orders_exactly_once(mesh: FullMesh, placed: Iterable[PlacedOrder]) -> None:
    """`placed`: every order the clients sent for their users, each with its final ack."""
    acknowledged = {p.ack.order_id: p for p in placed if p.ack.accepted}
    assert acknowledged, "nothing was placed"
    shard_id = mesh.shard.shard_id
    by_user: dict[int, list[PlacedOrder]] = defaultdict(list)
    for order in acknowledged.values():
        by_user[order.user_id].append(order)
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        shard = ShardClient(shard_channel)
        persister = PersisterClient(persister_channel)
        for user_id, orders in sorted(by_user.items()):
            sequences = sorted(int(p.ack.order_id.rsplit(":", 1)[1]) for p in orders)
            assert sequences == list(range(1, len(orders) + 1)), (
                f"user {user_id}: order ids are not 1..{len(orders)}: gaps or extras"
            )
            actor = await shard.actor(user_id)
            # A user evicted meanwhile (a shard with a short idle TTL) is read from storage.
            state = actor.state if actor.resident else (await persister.stored_user(user_id)).state
            assert state.user_seq == len(orders), (user_id, state.user_seq)
    await _check_database_rows(mesh.database_url, acknowledged, list(by_user))
    async with matcher_clients(mesh) as matchers:
        await _check_matchers_agree(mesh.database_url, matchers, acknowledged)
        for group, matcher in matchers.items():
            await _check_each_accepted_once(matcher, shard_id, group, acknowledged)


async def _check_database_rows(
    database_url: str, acknowledged: Mapping[str, PlacedOrder], user_ids: Sequence[int]
) -> None:
    expected = {(p.user_id, p.client_order_id, p.ack.order_id) for p in acknowledged.values()}
    connection = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + AGREE_TIMEOUT_S
        while True:
            rows = await connection.fetch(
                "SELECT user_id, client_order_id, order_id FROM orders"
                " WHERE user_id = ANY($1::bigint[])",
                list(user_ids),
            )
            stored = {(int(r["user_id"]), r["client_order_id"], r["order_id"]) for r in rows}
            if stored == expected or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
    finally:
        await connection.close()
    assert stored == expected, (
        f"PostgreSQL lacks {sorted(expected - stored)[:5]} and has unacknowledged"
        f" {sorted(stored - expected)[:5]}"
    )


@asynccontextmanager
async def matcher_clients(mesh: FullMesh) -> AsyncIterator[dict[str, MatcherClient]]:
    """A client of every matcher group of `mesh`, closed afterwards."""
    channels = {group: aio_channel(process.address) for group, process in mesh.matchers.items()}
    try:
        yield {group: MatcherClient(channel) for group, channel in channels.items()}
    finally:
        await asyncio.gather(*(channel.close() for channel in channels.values()))


async def _check_matchers_agree(
    database_url: str,
    matchers: Mapping[str, MatcherClient],
    acknowledged: Mapping[str, PlacedOrder],
) -> None:
    """Each order is at its matcher; a finished one ends there as PostgreSQL says."""
    order_ids = sorted(acknowledged)
    deadline = time.monotonic() + AGREE_TIMEOUT_S
    while True:
        problems = await _matcher_disagreements(database_url, matchers, acknowledged, order_ids)
        if not problems or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.05)
    assert not problems, f"{len(problems)} orders disagree: {problems[:5]}"


async def _matcher_disagreements(
    database_url: str,
    matchers: Mapping[str, MatcherClient],
    acknowledged: Mapping[str, PlacedOrder],
    order_ids: Sequence[str],
) -> list[str]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT order_id, status, remaining_lots FROM orders WHERE order_id = ANY($1::text[])",
            list(order_ids),
        )
    finally:
        await connection.close()
    stored = {r["order_id"]: (int(r["status"]), int(r["remaining_lots"])) for r in rows}
    problems: list[str] = []
    for start in range(0, len(order_ids), QUERY_CHUNK):
        chunk = order_ids[start : start + QUERY_CHUNK]
        states = await asyncio.gather(
            *(matchers[GROUP_OF[acknowledged[o].symbol]].get_order(o) for o in chunk)
        )
        for order_id, state in zip(chunk, states, strict=True):
            problem = _disagreement(order_id, state, stored.get(order_id))
            if problem:
                problems.append(problem)
    return problems


def _disagreement(
    order_id: str, state: matcher_pb2.OrderState | None, stored: tuple[int, int] | None
) -> str | None:
    if state is None:
        return f"{order_id} never reached its matcher"
    if stored is None:
        return f"{order_id} has no row in PostgreSQL"
    status, remaining = stored
    if status in TERMINAL and (state.status, state.remaining_lots) != stored:
        return (
            f"{order_id}: PostgreSQL {status}/{remaining},"
            f" matcher {state.status}/{state.remaining_lots}"
        )
    return None


async def _check_each_accepted_once(
    matcher: MatcherClient, shard_id: str, group: str, acknowledged: Mapping[str, PlacedOrder]
) -> None:
    events = await matcher.events(shard_id, 1)
    answers = Counter(
        event.order_id for event in events if event.WhichOneof("event") in ("accepted", "rejected")
    )
    mine = [o for o, p in acknowledged.items() if GROUP_OF[p.symbol] == group]
    wrong = {o: answers[o] for o in mine if answers[o] != 1}
    assert not wrong, f"{group}: orders accepted or rejected other than once: {wrong}"
