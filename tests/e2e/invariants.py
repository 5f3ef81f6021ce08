"""The mesh's invariants, checked from outside after every end-to-end test.

Read through the services' public queries and PostgreSQL (the system of record),
once the mesh is quiet (`wait_quiet`), over every shard of the mesh (one, or the
clusters of a sharded mesh, each with its own persister):
0. no user is resident in two shards;
1. money is conserved across PostgreSQL and resident state, per asset, over all shards:
   resident users + clearing + fees + stored (non-resident) users = deposits - withdrawals,
   each shard's own books balance, and PostgreSQL's double-entry ledger agrees with them:
   every user's ledger sum is that user's balance wherever it lives (resident or
   stored), the clearing and fee accounts match the shards' together, and the external
   account is minus the net deposits;
2. every reservation is backed by an open order or a saga in flight (pending orders
   are in the open-orders index), and no balance is negative or over-reserved;
3. the matcher's open orders equal the index of the shard holding the user, user by
   user and group by group (order id and lots left), and a user has none at any
   matcher under a shard that does not hold it;
4. every acknowledged order is present: live in its shard's index, or finished in
   PostgreSQL; and PostgreSQL holds a row for every one of them;
5. every persister's DB-side oracles (duplicates or refused rows that reached the
   database) are all zero;
6. the independent auditor (`independent_audit.py`), which reads none of the above
   internals, finds nothing.

Several services answer at their own pace (the write-behind lands ~10 ms after the
shard, a GTD order can expire in the middle of a look), so each comparison is
polled with a deadline and the failure names the last disagreement seen.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import asyncpg
import grpc

from gateway.client import AdminClient
from protos.oms.v1 import (
    common_pb2,
    matcher_pb2,
    matcher_pb2_grpc,
    persister_pb2,
    persister_pb2_grpc,
    shard_pb2,
    shard_pb2_grpc,
    status_pb2,
    status_pb2_grpc,
)
from services.clients.channels import mesh_channel
from services.markets.catalog import load_catalog
from tests.e2e.independent_audit import audit_from_outside
from tests.full_mesh import FullMesh
from tests.gateway.gateway_process import ADMIN_KEY, ADMIN_SECRET

_GROUPS = {market.symbol: market.matcher_group for market in load_catalog().markets}
LIVE = (
    common_pb2.ORDER_STATUS_PENDING,
    common_pb2.ORDER_STATUS_OPEN,
    common_pb2.ORDER_STATUS_PARTIALLY_FILLED,
)
TERMINAL = (
    common_pb2.ORDER_STATUS_FILLED,
    common_pb2.ORDER_STATUS_CANCELLED,
    common_pb2.ORDER_STATUS_EXPIRED,
    common_pb2.ORDER_STATUS_REJECTED,
)
ORACLE_COUNTERS = (
    "duplicate_command_reached_db",
    "duplicate_order_reached_db",
    "duplicate_fill_reached_db",
    "rejected_rows",
)
QUIET_TIMEOUT_S = 30.0
AGREE_TIMEOUT_S = 15.0
POLL_S = 0.05
CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ShardAddresses:
    shard_id: str
    shard: str
    persister: str


@dataclass(frozen=True)
class MeshAddresses:
    shards: tuple[ShardAddresses, ...]
    matchers: Mapping[str, str]  # group -> address
    # A gateway that takes the test admin key: the independent auditor asks its admin
    # API too ("": the auditor reads PostgreSQL alone).
    gateway: str = ""

    @classmethod
    def single(
        cls,
        *,
        shard: str,
        persister: str,
        matchers: Mapping[str, str],
        shard_id: str = "s1",
        gateway: str = "",
    ) -> MeshAddresses:
        return cls((ShardAddresses(shard_id, shard, persister),), matchers, gateway)


class MeshInvariantError(AssertionError):
    pass


def mesh_addresses(mesh: FullMesh) -> MeshAddresses:
    return MeshAddresses.single(
        shard=mesh.shard.address,
        persister=mesh.persister.address,
        matchers=mesh.matcher_addresses,
        shard_id=mesh.shard.shard_id,
        gateway=mesh.gateway.address,
    )


async def check_full_mesh(
    mesh: FullMesh,
    acknowledged_order_ids: Iterable[str] = (),
    *,
    clearing_settled: bool = True,
    audit_expects: Mapping[str, int] | None = None,
) -> None:
    """`check_mesh_invariants` of a test's FullMesh."""
    await check_mesh_invariants(
        mesh_addresses(mesh),
        mesh.database_url,
        acknowledged_order_ids,
        clearing_settled=clearing_settled,
        audit_expects=audit_expects,
    )


@dataclass
class _ShardStubs:
    shard_id: str
    shard: shard_pb2_grpc.UserShardStub
    persister: persister_pb2_grpc.PersisterStub
    persister_status: status_pb2_grpc.StatusStub


@dataclass
class _Stubs:
    shards: dict[str, _ShardStubs]
    matchers: dict[str, matcher_pb2_grpc.MatcherStub]

    def any_persister(self) -> persister_pb2_grpc.PersisterStub:
        return next(iter(self.shards.values())).persister


@asynccontextmanager
async def _stubs(addresses: MeshAddresses) -> AsyncIterator[_Stubs]:
    async with AsyncExitStack() as stack:
        shards = {}
        for entry in addresses.shards:
            shard = await stack.enter_async_context(mesh_channel(entry.shard))
            persister = await stack.enter_async_context(mesh_channel(entry.persister))
            shards[entry.shard_id] = _ShardStubs(
                entry.shard_id,
                shard_pb2_grpc.UserShardStub(shard),
                persister_pb2_grpc.PersisterStub(persister),
                status_pb2_grpc.StatusStub(persister),
            )
        matchers = {
            group: matcher_pb2_grpc.MatcherStub(
                await stack.enter_async_context(mesh_channel(address))
            )
            for group, address in addresses.matchers.items()
        }
        yield _Stubs(shards, matchers)


async def _until(probe: Callable[[], Awaitable[str | None]], timeout_s: float, what: str) -> None:
    """Poll `probe` (None: holds; text: the disagreement) until it holds or time is up.

    A service restarting under the check answers UNAVAILABLE for a moment: ask again.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            problem = await probe()
        except grpc.aio.AioRpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            problem = f"{error.code().name}: {error.details()}"
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise MeshInvariantError(f"{what} (still after {timeout_s:g} s): {problem}")
        await asyncio.sleep(POLL_S)


# --- quiet ------------------------------------------------------------------------------


async def wait_quiet(addresses: MeshAddresses, *, timeout_s: float = QUIET_TIMEOUT_S) -> None:
    """Poll until no saga is in flight, no command parked, and every shard has applied
    every matcher event the matchers made durable for it."""
    async with _stubs(addresses) as stubs:
        await _wait_quiet(stubs, timeout_s)


async def _wait_quiet(stubs: _Stubs, timeout_s: float) -> None:
    async def probe() -> str | None:
        for shard in stubs.shards.values():
            status = await shard.shard.GetStatus(
                shard_pb2.ShardStatusRequest(), timeout=CALL_TIMEOUT_S
            )
            snapshot = await shard.shard.GetInFlight(
                shard_pb2.InFlightRequest(), timeout=CALL_TIMEOUT_S
            )
            behind = await _matcher_backlog(stubs, shard.shard_id, dict(snapshot.matcher_sequences))
            if status.in_flight_sagas or status.parked_commands or behind:
                return (
                    f"shard {shard.shard_id}: in flight {status.in_flight_sagas}, parked"
                    f" {status.parked_commands}, matcher events not yet applied {behind}"
                )
        return None

    await _until(probe, timeout_s, "the mesh is not quiet")


async def _matcher_backlog(
    stubs: _Stubs, shard_id: str, applied: Mapping[str, int]
) -> dict[str, int]:
    backlog: dict[str, int] = {}
    for group, matcher in stubs.matchers.items():
        # The open-orders snapshot of user 0 costs nothing and names the stream's end.
        snapshot = await matcher.GetOpenOrders(
            matcher_pb2.OpenOrdersQuery(oms_shard=shard_id, user_id=0), timeout=CALL_TIMEOUT_S
        )
        if snapshot.as_of_sequence > applied.get(group, 0):
            backlog[group] = snapshot.as_of_sequence - applied.get(group, 0)
    return backlog


# --- the check ------------------------------------------------------------------------


async def check_mesh_invariants(
    addresses: MeshAddresses,
    database_url: str,
    acknowledged_order_ids: Iterable[str] = (),
    *,
    clearing_settled: bool = True,
    audit_expects: Mapping[str, int] | None = None,
) -> None:
    """Wait for quiet, then check every invariant (see the module's docstring).

    `audit_expects`: what the independent auditor must find, by check, where a test
    made it so on purpose (nothing, otherwise).

    `clearing_settled`: once both legs of every trade are settled (on one shard, or on
    two), the clearing accounts of every asset, summed over the shards, are back at zero.
    """
    acknowledged = sorted(set(acknowledged_order_ids))
    async with _stubs(addresses) as stubs:
        await _wait_quiet(stubs, QUIET_TIMEOUT_S)
        connection = await asyncpg.connect(database_url)
        try:
            await _until(
                lambda: _money_problem(stubs, connection, clearing_settled),
                AGREE_TIMEOUT_S,
                "money is not conserved",
            )
            await _until(
                lambda: _placement_problem(stubs, connection),
                AGREE_TIMEOUT_S,
                "reservations or open orders disagree",
            )
            await _until(
                lambda: _acknowledged_problem(stubs, connection, acknowledged),
                AGREE_TIMEOUT_S,
                "acknowledged orders are missing",
            )
        finally:
            await connection.close()
        for shard in stubs.shards.values():
            oracles = await _persister_counters(shard)
            moved = {n: oracles.get(n, 0) for n in ORACLE_COUNTERS if oracles.get(n, 0)}
            if moved:
                raise MeshInvariantError(f"DB-side oracles of {shard.shard_id} moved: {moved}")
    if addresses.gateway:
        async with AdminClient(
            addresses.gateway, api_key=ADMIN_KEY, api_secret=ADMIN_SECRET
        ) as admin:
            await audit_from_outside(database_url, admin=admin, expected=audit_expects)
    else:
        await audit_from_outside(database_url, expected=audit_expects)


@dataclass(frozen=True)
class _ShardView:
    """One shard's books and resident users as of one applied log position."""

    status: shard_pb2.ShardStatus
    resident: tuple[int, ...]


@dataclass(frozen=True)
class _MeshView:
    shards: dict[str, _ShardView]
    holder: dict[int, str]  # resident user -> the shard holding it


async def _shard_view(shard: shard_pb2_grpc.UserShardStub) -> _ShardView:
    # Status and the user list are two calls; taken again until no entry (a timer, an
    # eviction) was applied between them, they describe one log position.
    for _ in range(50):
        before = await shard.GetStatus(shard_pb2.ShardStatusRequest(), timeout=CALL_TIMEOUT_S)
        resident = await resident_users(shard)
        after = await shard.GetStatus(shard_pb2.ShardStatusRequest(), timeout=CALL_TIMEOUT_S)
        if before.applied_position == after.applied_position:
            return _ShardView(after, tuple(resident))
    raise MeshInvariantError("the shard never held still for two status reads")


async def _mesh_view(stubs: _Stubs) -> _MeshView | str:
    """Every shard's view, or the users resident in two shards (invariant 0)."""
    views = {shard_id: await _shard_view(s.shard) for shard_id, s in stubs.shards.items()}
    holder: dict[int, str] = {}
    for shard_id, view in views.items():
        for user_id in view.resident:
            if user_id in holder:
                return f"user {user_id} is resident in {holder[user_id]} and in {shard_id}"
            holder[user_id] = shard_id
    return _MeshView(views, holder)


async def resident_users(shard: shard_pb2_grpc.UserShardStub) -> list[int]:
    users: list[int] = []
    after = 0
    while True:
        page = await shard.ListUsers(
            shard_pb2.UserPageRequest(after_user_id=after, limit=1000), timeout=CALL_TIMEOUT_S
        )
        users.extend(page.user_ids)
        if not page.next_after_user_id:
            return users
        after = page.next_after_user_id


async def _actor(shard: _ShardStubs, user_id: int) -> shard_pb2.ActorView:
    view: shard_pb2.ActorView = await shard.shard.GetActor(
        shard_pb2.ActorQuery(user_id=user_id), timeout=CALL_TIMEOUT_S
    )
    return view


async def _stored_user(stubs: _Stubs, user_id: int) -> persister_pb2.StoredUser:
    stored: persister_pb2.StoredUser = await stubs.any_persister().GetStoredUser(
        persister_pb2.UserQuery(user_id=user_id), timeout=CALL_TIMEOUT_S
    )
    return stored


async def _database_users(connection: asyncpg.Connection) -> list[int]:
    return [int(row["user_id"]) for row in await connection.fetch("SELECT user_id FROM users")]


async def _persister_counters(shard: _ShardStubs) -> dict[str, int]:
    report: status_pb2.StatusReport = await shard.persister_status.GetStatus(
        status_pb2.StatusRequest(), timeout=CALL_TIMEOUT_S
    )
    return dict(report.counters)


# --- 1. money -------------------------------------------------------------------------


async def _money_problem(
    stubs: _Stubs, connection: asyncpg.Connection, clearing_settled: bool
) -> str | None:
    view = await _mesh_view(stubs)
    if isinstance(view, str):
        return view
    # Balances by user: resident ones from their shard, the rest from PostgreSQL. A user
    # who leaves memory after the view was taken was flushed with the same balances
    # (the mesh is quiet), so reading them from the shard is still right.
    balances: dict[int, dict[str, int]] = {}
    stored_totals: dict[str, int] = defaultdict(int)
    for user_id in sorted(set(await _database_users(connection)) | set(view.holder)):
        shard_id = view.holder.get(user_id)
        if shard_id is not None:
            actor = await _actor(stubs.shards[shard_id], user_id)
            balances[user_id] = {b.asset: b.total for b in actor.state.balances}
            continue
        stored = await _stored_user(stubs, user_id)
        balances[user_id] = {b.asset: b.total for b in stored.state.balances}
        for balance in stored.state.balances:
            stored_totals[balance.asset] += balance.total
    books: dict[str, shard_pb2.ShardAssetAccounts] = {}
    for shard_id, shard_view in view.shards.items():
        for entry in shard_view.status.accounts:
            owned = entry.resident + entry.clearing + entry.fees
            moved_in = entry.hydrated_in - entry.dehydrated_out
            if owned != entry.deposits - entry.withdrawals + moved_in:
                return f"{entry.asset}: the books of {shard_id} do not balance: {entry}"
            total = books.setdefault(entry.asset, shard_pb2.ShardAssetAccounts(asset=entry.asset))
            for name in ("resident", "clearing", "fees", "deposits", "withdrawals"):
                setattr(total, name, getattr(total, name) + getattr(entry, name))
    for asset, amount in stored_totals.items():
        if amount and asset not in books:
            return f"stored users hold {amount} {asset}, an asset no shard keeps books of"
    for asset, entry in books.items():
        inside = entry.resident + entry.clearing + entry.fees + stored_totals.get(asset, 0)
        outside = entry.deposits - entry.withdrawals
        if inside != outside:
            return (
                f"{asset}: resident {entry.resident} + clearing {entry.clearing} + fees"
                f" {entry.fees} + stored {stored_totals.get(asset, 0)} = {inside}, but deposits"
                f" - withdrawals = {outside} (over {len(view.shards)} shard(s))"
            )
        if clearing_settled and entry.clearing:
            return f"{asset}: clearing holds {entry.clearing} with every trade settled"
    return await _ledger_problem(connection, balances, books)


async def _ledger_problem(
    connection: asyncpg.Connection,
    balances: Mapping[int, Mapping[str, int]],
    books: Mapping[str, shard_pb2.ShardAssetAccounts],
) -> str | None:
    """PostgreSQL's ledger against the balances and the shard's accounts (write-behind lag
    shows as a difference that goes away: the caller polls)."""
    rows = await connection.fetch(
        "SELECT user_id, account, asset, sum(amount)::bigint AS total FROM ledger"
        " GROUP BY user_id, account, asset"
    )
    ledger_users: dict[int, dict[str, int]] = defaultdict(dict)
    accounts: dict[tuple[str, str], int] = defaultdict(int)
    for row in rows:
        if row["account"] == "user":
            ledger_users[int(row["user_id"])][row["asset"]] = int(row["total"])
        else:
            accounts[(row["account"], row["asset"])] += int(row["total"])
    for user_id in sorted(set(balances) | set(ledger_users)):
        held = {asset: amount for asset, amount in balances.get(user_id, {}).items() if amount}
        booked = {
            asset: amount for asset, amount in ledger_users.get(user_id, {}).items() if amount
        }
        if held != booked:
            return f"user {user_id}: balances {held}, but the ledger sums to {booked}"
    for asset, entry in books.items():
        expected = {
            "clearing": entry.clearing,
            "fees": entry.fees,
            "external": -(entry.deposits - entry.withdrawals),
        }
        for account, amount in expected.items():
            if accounts.get((account, asset), 0) != amount:
                return (
                    f"{asset}: the ledger's {account} account sums to"
                    f" {accounts.get((account, asset), 0)}, the shard's books say {amount}"
                )
    return None


# --- 2 and 3. reservations, and the matchers against the shard's index ---------------


async def _placement_problem(stubs: _Stubs, connection: asyncpg.Connection) -> str | None:
    view = await _mesh_view(stubs)
    if isinstance(view, str):
        return view
    for user_id in sorted(set(await _database_users(connection)) | set(view.holder)):
        holder = view.holder.get(user_id)
        actor = await _actor(stubs.shards[holder], user_id) if holder is not None else None
        if actor is not None and actor.resident:
            problem = _reservation_problem(user_id, actor)
            if problem:
                return problem
        for shard_id in stubs.shards:
            held = actor if shard_id == holder else None
            for group, matcher in stubs.matchers.items():
                snapshot = await matcher.GetOpenOrders(
                    matcher_pb2.OpenOrdersQuery(oms_shard=shard_id, user_id=user_id),
                    timeout=CALL_TIMEOUT_S,
                )
                at_matcher = sorted((s.order.order_id, s.remaining_lots) for s in snapshot.orders)
                in_shard = sorted(
                    (order.order_id, order.remaining_lots)
                    for order in (held.open_orders if held is not None else ())
                    if order.status in LIVE and _GROUPS[order.symbol] == group
                )
                if at_matcher != in_shard:
                    where = "indexes" if held is not None and held.resident else "(not resident)"
                    return (
                        f"user {user_id} group {group}: matcher holds {at_matcher} under"
                        f" {shard_id}, shard {shard_id} {where} {in_shard}"
                    )
    return None


def _reservation_problem(user_id: int, actor: shard_pb2.ActorView) -> str | None:
    backed: dict[str, int] = defaultdict(int)
    for order in actor.open_orders:
        if order.status not in LIVE:
            return f"user {user_id}: {order.order_id} is indexed with status {order.status}"
        if order.reserved:
            backed[order.reserved_asset] += order.reserved
    for balance in actor.state.balances:
        if balance.reserved != backed.get(balance.asset, 0):
            return (
                f"user {user_id} {balance.asset}: reserved {balance.reserved} but open orders"
                f" back {backed.get(balance.asset, 0)}"
            )
        if not 0 <= balance.reserved <= balance.total:
            return f"user {user_id} {balance.asset}: reserved {balance.reserved} of {balance.total}"
    return None


# --- 4. acknowledged orders -------------------------------------------------------------


async def _acknowledged_problem(
    stubs: _Stubs, connection: asyncpg.Connection, order_ids: Sequence[str]
) -> str | None:
    if not order_ids:
        return None
    stored = {
        row["order_id"]: int(row["status"])
        for row in await connection.fetch(
            "SELECT order_id, status FROM orders WHERE order_id = ANY($1::text[])", list(order_ids)
        )
    }
    missing = [order_id for order_id in order_ids if order_id not in stored]
    if missing:
        return f"{len(missing)} acknowledged orders have no row in PostgreSQL: {missing[:5]}"
    live: set[str] = set()
    for shard_id, user_id in sorted({_owner(order_id) for order_id in order_ids}):
        if shard_id not in stubs.shards:
            return f"orders of a shard this check does not know: {shard_id}"
        actor = await _actor(stubs.shards[shard_id], user_id)
        live.update(order.order_id for order in actor.open_orders if actor.resident)
    unfinished = [
        (order_id, stored[order_id])
        for order_id in order_ids
        if order_id not in live and stored[order_id] not in TERMINAL
    ]
    if unfinished:
        return f"orders neither live in the shard nor finished in PostgreSQL: {unfinished[:5]}"
    return None


def _owner(order_id: str) -> tuple[str, int]:
    """The shard and the user an order id names ("<shard>:<user>:<seq>")."""
    shard_id, user_id, _ = order_id.split(":")
    return shard_id, int(user_id)
