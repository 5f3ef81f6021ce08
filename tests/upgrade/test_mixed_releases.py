"""The previous release's services beside this one's, both ways round, trading.

A mesh is rolled service by service, so for a while an old gateway, persister, bridge
and reconciler talk to new shards and matchers, or new ones to old. Their protocols
change only by added proto fields (`make protocheck` holds them to that); here the
previous release (`PREVIOUS_RELEASE`, checked out of this repository's history with
its protos generated) runs beside this checkout in one mesh of real processes, and a
client trades through it: accounts opened and funded, two users' orders crossing, a
resting order cancelled, an operator's halt and resume of a user, the fills in the
history PostgreSQL serves. Skipped, saying so, where the clone has no history.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from io import BytesIO
from pathlib import Path

import pytest

from gateway.client import OmsClient
from protos.oms.v1 import common_pb2, shard_pb2
from tests.full_mesh import FullMesh
from tests.gateway.accounts import BTC, PRICE, buy, eventually, open_account, refusal
from tests.service_process import ROOT, ServiceProcess

pytestmark = pytest.mark.slow
# The release before state-machine versions and the operator's request ids: the commit
# this work began from. (With release tags, the newest `v*` tag before HEAD.)
PREVIOUS_RELEASE = "8acff23"
FUNDS = {"USDT": 10_000_000_000, "BTC": 1_000_000}


def _git(*arguments: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(ROOT), *arguments], check=True, capture_output=True
    ).stdout


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The previous release's tree, its protos generated, ready to run services from."""
    try:
        commit = _git("rev-parse", "--verify", f"{PREVIOUS_RELEASE}^{{commit}}").decode().strip()
        archive = _git("archive", "--format=tar", commit)
    except (subprocess.CalledProcessError, FileNotFoundError) as error:
        pytest.skip(f"release {PREVIOUS_RELEASE} is not in this clone's history: {error}")
    tree = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    sources = sorted(str(path.relative_to(tree)) for path in tree.glob("protos/**/*.proto"))
    sources = [source for source in sources if "/upstream/" not in source]
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.",
         "--grpc_python_out=.", *sources],
        cwd=tree,
        check=True,
        capture_output=True,
    )  # fmt: skip
    # Older than versions: no state-machine version anywhere in it.
    assert not (tree / "services/runtime/upgrades.py").exists()
    yield tree


def _sell(client: OmsClient, client_order_id: str, quantity_lots: int) -> object:
    return client.place_request(
        client_order_id, BTC, common_pb2.SIDE_SELL, price_ticks=PRICE, quantity_lots=quantity_lots
    )


async def _trade(mesh: FullMesh) -> None:
    address = mesh.gateway.address
    async with mesh.admin() as admin:
        buyer = await open_account(admin, FUNDS)
        seller = await open_account(admin, FUNDS)
        async with buyer.client(address) as bids, seller.client(address) as asks:
            bought = await bids.place_order(buy(bids, "cross-buy", 3))
            assert bought.accepted, bought
            sold = await asks.place_order(_sell(asks, "cross-sell", 3))  # type: ignore[arg-type]
            assert sold.accepted, sold
            await eventually(bids.open_orders, lambda orders: not orders)
            await eventually(asks.open_orders, lambda orders: not orders)
            balances = await eventually(
                bids.balances, lambda found: found["BTC"].total > FUNDS["BTC"]
            )
            assert balances["USDT"].reserved == 0
            resting = await bids.place_order(buy(bids, "resting", 2, price_ticks=PRICE - 100))
            assert resting.accepted, resting
            assert (await bids.cancel(order_id=resting.order_id)).accepted
            # An operator's halt and resume through this gateway.
            assert (await admin.halt_user(buyer.user_id, note="mixed releases")).accepted
            halted = await bids.place_order(buy(bids, "while-halted", 1))
            assert halted.reject_reason == shard_pb2.SHARD_REJECT_REASON_TRADING_HALTED, halted
            assert (await admin.resume_user(buyer.user_id)).accepted
            after = await bids.place_order(buy(bids, "after-resume", 1, price_ticks=PRICE - 100))
            assert after.accepted, after
            # The persister wrote the fills: the history reads them back from PostgreSQL.
            fills = await eventually(bids.fill_history, lambda found: len(found) >= 1)
            assert sum(fill.quantity_lots for fill in fills) == 3
        mine = await refusal(admin.halt_user(9_000_000_001))
        assert mine.reason == "GATEWAY_ERROR_REASON_UNKNOWN_USER", mine


def _run_previous(processes: list[ServiceProcess], tree: Path) -> None:
    for process in processes:
        process.source_root = tree


@pytest.mark.parametrize("old", ["roles", "state_machines"])
def test_the_previous_release_beside_this_one_trades(
    old: str,
    previous_release: Path,
    new_mesh: Callable[..., FullMesh],
) -> None:
    mesh = new_mesh()
    if old == "roles":  # the gateway, persister, bridge and reconciler of the old release
        _run_previous(
            [mesh.gateway, mesh.persister, mesh.bridge, mesh.reconciler], previous_release
        )
    else:  # the shard and the matchers of the old release
        _run_previous([mesh.shard, *mesh.matchers.values()], previous_release)
    mesh.start()
    for process in mesh.all():  # each runs from the tree it was given
        expected = previous_release if process.source_root == previous_release else ROOT
        assert Path(f"/proc/{process.pid}/cwd").resolve() == expected.resolve(), process
    asyncio.run(_trade(mesh))
