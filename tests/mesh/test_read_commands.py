"""Every read command of `oms` and `omsctl` against the default mesh (`oms up`, as
`make run` runs it: one replica per group, one shard cluster routed statically), each
run as an operator runs it, a subprocess given the state folder: each answers in the
user's terms, never with a gRPC status name or a traceback. Where a command does not
apply to this form of mesh (a version switch, the routing document, groups found in
etcd) it says why and what to run instead.

One mesh for the module (`running_mesh`, `tests/mesh/conftest.py`); the demo trades on
it once (`trader`), which gives the client commands a user with a key and an order.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import grpc
import pytest

from tests.mesh.up_process import Ran, RunningMesh, run_demo

pytestmark = pytest.mark.slow

# gRPC's status names, as a tool must never print them ("CANCELLED" is also an order's
# status, and "OK" a word).
RAW_STATUS = re.compile(
    r"\b(" + "|".join(c.name for c in grpc.StatusCode if c.name not in ("OK", "CANCELLED")) + r")\b"
)


def in_users_terms(ran: Ran, code: int = 0) -> str:
    """What the command printed, checked: its exit status, and nothing raw."""
    printed = ran.printed
    assert ran.code == code, printed
    assert "Traceback" not in printed, printed
    assert "Method not found" not in printed, printed
    assert not RAW_STATUS.search(printed), printed
    return printed


@dataclass(frozen=True)
class Trader:
    """The demo's alice, with a key of her own, and her filled order."""

    user_id: int
    api_key: str
    api_secret: str
    order_id: str
    client_order_id: str


@pytest.fixture(scope="module")
def trader(running_mesh: RunningMesh) -> Trader:
    shown = run_demo(running_mesh.state_dir, running_mesh.environment)
    found = re.search(r"created alice \(user (\d+)\)", shown)
    assert found, shown
    user_id = int(found.group(1))
    client = ("client", "--state-dir", str(running_mesh.state_dir), "--user-id", str(user_id))
    created = in_users_terms(running_mesh.oms(*client, "keys", "create"))
    api_key = created.split()[0]
    api_secret = created.split("secret (shown once): ")[1].split()[0]
    signed = (*client, "--api-key", api_key, f"--api-secret={api_secret}")
    history = in_users_terms(running_mesh.oms(*signed, "history"))
    order_id, client_order_id = history.splitlines()[1].split()[:2]
    return Trader(user_id, api_key, api_secret, order_id, client_order_id)


def test_oms_status_shows_every_process_and_says_etcd_holds_none(
    running_mesh: RunningMesh,
) -> None:
    where = ("--state-dir", str(running_mesh.state_dir))
    table = in_users_terms(running_mesh.oms("status", *where))
    assert "8 of 8 processes answered" in table, table
    rows = json.loads(in_users_terms(running_mesh.oms("status", "--json", *where)))
    assert sorted((row["service"], row["group"]) for row in rows) == [
        ("bridge", "s1"),
        ("gateway", ""),
        ("marketdata", ""),
        ("matcher", "g1"),
        ("matcher", "g2"),
        ("persister", "s1"),
        ("reconciler", "s1"),
        ("shard", "s1"),
    ], rows
    assert all(row["health"] == "ok" for row in rows), rows
    # One replica per group keeps nothing in etcd: said, with what to run instead.
    in_etcd = in_users_terms(running_mesh.oms("status", "--etcd", *where), code=2)
    assert "one replica per group" in in_etcd and "without --etcd" in in_etcd, in_etcd


def test_upgrade_status_shows_each_groups_version_and_where_a_switch_runs(
    running_mesh: RunningMesh,
) -> None:
    where = ("--state-dir", str(running_mesh.state_dir))
    for ran in (
        running_mesh.oms("upgrade", "status", *where),
        running_mesh.omsctl("upgrade", "status"),
    ):
        shown = in_users_terms(ran)
        # A new group starts at its newest version.
        for group, version in (("shard/s1", 3), ("matcher/g1", 2), ("matcher/g2", 2)):
            assert f"{group}: version {version} in force; one replica (file log)" in shown, shown
        assert re.search(r"127\.0\.0\.1:\d+ leader: at 3, implements 1,2,3", shown), shown
        assert re.search(r"127\.0\.0\.1:\d+ leader: at 2, implements 1,2", shown), shown
        assert "`oms up --replicas 3`" in shown, shown
    groups = json.loads(in_users_terms(running_mesh.oms("upgrade", "status", "--json", *where)))
    assert sorted(group["group"] for group in groups) == ["matcher/g1", "matcher/g2", "shard/s1"]
    for group in groups:
        assert group["version"] == (3 if group["group"] == "shard/s1" else 2), group
        assert not group["replicated"], group
        assert [replica["role"] for replica in group["replicas"]] == ["leader"], group
    in_etcd = in_users_terms(running_mesh.oms("upgrade", "status", "--etcd", *where), code=2)
    assert "one replica per group" in in_etcd and "without --etcd" in in_etcd, in_etcd
    # The switch itself is refused, in words, changing nothing.
    switch = running_mesh.oms("upgrade", "activate", "shard/s1", "2", *where)
    refused = in_users_terms(switch, code=1)
    assert "one replica on a file log" in refused and "--replicas 3" in refused, refused


def test_omsctl_says_the_mesh_routes_statically_and_asks_its_one_shard(
    running_mesh: RunningMesh, trader: Trader
) -> None:
    shown = in_users_terms(running_mesh.omsctl("show"))
    assert "routes every user to its one shard cluster, s1 (static routing)" in shown, shown
    assert "no routing document" in shown and "`oms up --shards N`" in shown, shown
    owner = in_users_terms(running_mesh.omsctl("owner", str(trader.user_id)))
    assert owner.startswith(f"user {trader.user_id}: s1 (static routing"), owner
    for ran in (running_mesh.omsctl("residents"), running_mesh.omsctl("residents", "s1")):
        residents = in_users_terms(ran)
        assert residents.startswith("static routing (no routing document)"), residents
        assert re.search(r"s1 +\d+ resident, 0 leaving", residents), residents
    unknown = in_users_terms(running_mesh.omsctl("residents", "s9"), code=1)
    assert "one shard cluster, s1: no s9" in unknown, unknown


def test_infra_status_and_the_audit(running_mesh: RunningMesh, trader: Trader) -> None:
    where = ("--state-dir", str(running_mesh.state_dir))
    infra = in_users_terms(running_mesh.oms("infra", "status", *where))
    assert re.search(r"etcd +running", infra) and re.search(r"postgres +running", infra), infra
    audit = in_users_terms(running_mesh.oms("audit", *where))
    assert audit.startswith("oms audit: clean"), audit


def test_client_reads_with_the_folders_gateway_and_a_users_key(
    running_mesh: RunningMesh, trader: Trader
) -> None:
    client = ("client", "--state-dir", str(running_mesh.state_dir))
    user = ("--user-id", str(trader.user_id))
    signed = (*client, *user, "--api-key", trader.api_key, f"--api-secret={trader.api_secret}")
    assert "no open orders" in in_users_terms(running_mesh.oms(*signed, "orders"))
    balances = in_users_terms(running_mesh.oms(*signed, "balances"))
    assert re.search(r"BTC +30000000 +0 +30000000", balances), balances
    positions = in_users_terms(running_mesh.oms(*signed, "positions"))
    assert re.search(r"BTC-USDT +3000 ", positions), positions
    fills = in_users_terms(running_mesh.oms(*signed, "fills"))
    assert trader.order_id in fills and "taker" in fills, fills
    for which in (("--order-id", trader.order_id), ("--client-order-id", trader.client_order_id)):
        order = in_users_terms(running_mesh.oms(*signed, "order", *which))
        assert trader.order_id in order and "FILLED" in order, order
    # The operator's reads sign with the folder's admin key.
    users = in_users_terms(running_mesh.oms(*client, "admin", "users"))
    assert f"user {trader.user_id} resident healthy cluster=s1" in users, users
    audit = in_users_terms(running_mesh.oms(*client, "admin", "audit"))
    assert "api_key.create" in audit, audit
    keys = running_mesh.oms(*client, *user, "keys", "list")
    assert trader.api_key in in_users_terms(keys)
    # No key of the user's: said, with how the folder's admin key makes one.
    unsigned = in_users_terms(running_mesh.oms(*client, "orders"), code=2)
    assert "a user id, API key and secret are needed" in unsigned, unsigned
    assert "keys create" in unsigned, unsigned
