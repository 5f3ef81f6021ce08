"""`oms client`: the public API from a terminal, against the real mesh."""

from __future__ import annotations

import asyncio

import pytest

from services.command_line import main
from tests.full_mesh import FullMesh
from tests.gateway.accounts import Account, open_account


def new_account(mesh: FullMesh, deposits: dict[str, int]) -> Account:
    async def create() -> Account:
        async with mesh.admin() as admin:
            return await open_account(admin, deposits)

    return asyncio.run(create())


def oms_client(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    code = main(["client", *arguments])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_place_list_cancel_and_balances_from_the_command_line(
    shared_mesh: FullMesh, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    account = new_account(shared_mesh, {"USDT": 10_000_000_000})
    monkeypatch.setenv("OMS_GATEWAY_ADDRESS", shared_mesh.gateway.address)
    monkeypatch.setenv("OMS_USER_ID", str(account.user_id))
    monkeypatch.setenv("OMS_API_KEY", account.api_key)
    monkeypatch.setenv("OMS_API_SECRET", account.api_secret)

    code, out, _ = oms_client(
        capsys, "place", "BTC-USDT", "buy", "2", "--price", "6400000", "--client-order-id", "cli-1"
    )
    order_id = f"s1:{account.user_id}:1"
    assert code == 0
    assert (
        out.strip()
        == f"accepted {order_id} (client id cli-1) PENDING at log position "
        + (out.strip().rsplit(" ", 1)[1])
    )
    code, out, _ = oms_client(capsys, "orders")
    assert code == 0
    header, row = out.strip().splitlines()
    columns = "order client id symbol side type price qty filled left status"
    assert header.split() == columns.split()
    assert row.split()[:8] == [order_id, "cli-1", "BTC-USDT", "BUY", "LIMIT", "6400000", "2", "0"]

    code, out, _ = oms_client(capsys, "balances")
    assert code == 0
    usdt = next(line for line in out.splitlines() if line.strip().startswith("USDT"))
    reserved = 2 * 6_400_000 + 2 * 6_400_000 * 2_000 // 1_000_000
    assert usdt.split() == ["USDT", "10000000000", str(reserved), str(10_000_000_000 - reserved)]

    code, out, _ = oms_client(capsys, "cancel", "--client-order-id", "cli-1")
    assert (code, out.strip()) == (0, f"cancel of {order_id} is on its way to the matcher")
    code, out, _ = oms_client(capsys, "positions")
    assert (code, out.strip()) == (0, "no positions")

    # A refusal by the shard and one by the gateway: exit status 1, the reason in words.
    code, out, _ = oms_client(capsys, "place", "BTC-USDT", "buy", "100000", "--price", "6500000")
    assert code == 1 and "rejected" in out and "INSUFFICIENT_FUNDS" in out
    code, _, err = oms_client(capsys, "place", "DOGE-USDT", "buy", "1", "--price", "1")
    assert code == 1 and err.startswith("refused: UNKNOWN_SYMBOL")
    code, _, err = oms_client(capsys, "--api-secret", "wrong", "balances")
    assert (code, err.strip()) == (1, "refused: BAD_SIGNATURE: signature does not match")


def test_missing_credentials_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OMS_USER_ID", "OMS_API_KEY", "OMS_API_SECRET"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = oms_client(capsys, "balances")
    assert code == 2 and "OMS_API_KEY" in err
