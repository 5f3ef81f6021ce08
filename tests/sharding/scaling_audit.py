"""What the scaling tests set up and check alike: a mesh's traders (whale makers pinned
where they are, normal takers routed by the hash), the routing document as etcd has it,
and every user's order history against what the load was told."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.routing.core.routing_document import RoutingDocument
from services.routing.routing_store import RoutingStore
from services.routing.wave_controller import WaveController
from tests.e2e.gateway_load import FUNDS, LOAD_TIER
from tests.gateway.accounts import Account, open_account
from tests.sharded_mesh import ShardedMesh
from tests.sharding.scaling_load import ScalingLoad


@dataclass(frozen=True)
class Traders:
    makers: Sequence[Account]  # whales, pinned: the hash never moves them
    takers: Sequence[Account]

    @property
    def taker_ids(self) -> list[int]:
        return [taker.user_id for taker in self.takers]

    def load(self, address: str) -> ScalingLoad:
        return ScalingLoad(address, self.makers, self.takers)


async def open_traders(
    mesh: ShardedMesh, controller: WaveController, *, makers: int, takers: int
) -> Traders:
    """Funded accounts; each maker pinned to the cluster that owns it now (no move)."""
    async with mesh.admin() as admin:
        made = [await open_account(admin, FUNDS, tier=LOAD_TIER) for _ in range(makers)]
        taken = [await open_account(admin, FUNDS) for _ in range(takers)]
    start = await current_document(controller.store)
    for maker in made:
        await controller.move(maker.user_id, start.owner_of(maker.user_id), pin=True)
    return Traders(made, taken)


async def current_document(store: RoutingStore) -> RoutingDocument:
    stored = await store.read()
    assert stored is not None
    return stored.document


async def audit_histories(mesh: ShardedMesh, load: ScalingLoad, accounts: list[Account]) -> None:
    """Each user's history holds each accepted order once, numbered 1..n across clusters."""
    accepted: dict[int, list[str]] = {}
    for client_order_id, ack in load.acks.items():
        if ack.accepted:
            accepted.setdefault(load.users_of[client_order_id], []).append(ack.order_id)
    for account in accounts:
        async with account.client(mesh.gateway.address) as client:
            history = await client.order_history(limit=1_000)
        ids = sorted(order.order_id for order in history)
        assert ids == sorted(accepted.get(account.user_id, [])), account.user_id
        sequences = sorted(int(order_id.rsplit(":", 1)[1]) for order_id in ids)
        assert sequences == list(range(1, len(ids) + 1)), (account.user_id, ids[:5])
