"""`oms client`: the public API from a terminal, against the real mesh."""

from __future__ import annotations

import asyncio

import pytest

from services.command_line import main
from tests.full_mesh import FullMesh
from tests.gateway.accounts import Account, eventually, open_account


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


def test_cancel_all_and_its_dead_mans_switch_from_the_command_line(
    shared_mesh: FullMesh, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    account = new_account(shared_mesh, {"USDT": 10_000_000_000})
    monkeypatch.setenv("OMS_GATEWAY_ADDRESS", shared_mesh.gateway.address)
    monkeypatch.setenv("OMS_USER_ID", str(account.user_id))
    monkeypatch.setenv("OMS_API_KEY", account.api_key)
    monkeypatch.setenv("OMS_API_SECRET", account.api_secret)
    for _ in (1, 2):
        code, out, _ = oms_client(capsys, "place", "BTC-USDT", "buy", "1", "--price", "6400000")
        assert code == 0, out
    placed = [f"s1:{account.user_id}:{number}" for number in (1, 2)]
    code, out, _ = oms_client(capsys, "cancel-all", "--symbol", "BTC-USDT")
    assert code == 0, out
    assert out.strip().splitlines() == [
        *(f"cancel of {order_id} is on its way to the matcher" for order_id in placed),
        "2 cancels sent, 0 already on their way",
    ]
    code, out, _ = oms_client(capsys, "cancel-all")
    assert (code == 0 and out.strip().endswith("0 cancels sent, 0 already on their way")) or (
        "already on their way" in out
    ), out
    code, _, err = oms_client(capsys, "cancel-all", "--symbol", "DOGE-USDT")
    assert code == 1 and err.startswith("refused: UNKNOWN_SYMBOL"), err
    # The dead man's switch: armed, disarmed, refused.
    code, out, _ = oms_client(capsys, "cancel-all-after", "60000")
    assert code == 0 and out.startswith("armed: every open order is cancelled at "), out
    code, out, _ = oms_client(capsys, "cancel-all-after", "0")
    assert (code, out.strip()) == (0, "disarmed")
    code, out, _ = oms_client(capsys, "cancel-all-after", "5")
    assert (code, out.strip()) == (1, "cancel-all-after refused: INVALID_TIMEOUT")


def test_missing_credentials_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OMS_USER_ID", "OMS_API_KEY", "OMS_API_SECRET"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = oms_client(capsys, "balances")
    assert code == 2 and "OMS_API_KEY" in err


def test_one_order_and_the_histories_from_the_command_line(
    shared_mesh: FullMesh, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two accounts trade ETH-USDT (no other test here does), one lot pair at a time.
    buyer = new_account(shared_mesh, {"USDT": 10_000_000_000})
    seller = new_account(shared_mesh, {"ETH": 10_000_000})
    monkeypatch.setenv("OMS_GATEWAY_ADDRESS", shared_mesh.gateway.address)

    def as_user(account: Account) -> None:
        monkeypatch.setenv("OMS_USER_ID", str(account.user_id))
        monkeypatch.setenv("OMS_API_KEY", account.api_key)
        monkeypatch.setenv("OMS_API_SECRET", account.api_secret)

    as_user(seller)
    code, _, _ = oms_client(
        capsys, "place", "ETH-USDT", "sell", "3", "--price", "360000", "--client-order-id", "s-1"
    )
    assert code == 0
    as_user(buyer)
    for n in (1, 2):
        code, _, _ = oms_client(
            capsys, "place", "ETH-USDT", "buy", "3", "--price", "340000" if n == 2 else "360000",
            "--client-order-id", f"b-{n}",
        )  # fmt: skip
        assert code == 0
    code, out, _ = oms_client(capsys, "order", "--client-order-id", "b-1")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split()[-4:] == ["accepted", "ms", "updated", "ms"]
    assert row.split()[:2] == [f"s1:{buyer.user_id}:1", "b-1"]

    code, out, _ = oms_client(capsys, "history", "--limit", "1")
    lines = out.strip().splitlines()
    assert code == 0 and lines[1].split()[1] == "b-1" and lines[-1].startswith("more: --cursor ")
    cursor = lines[-1].split()[-1]
    code, out, _ = oms_client(capsys, "history", "--limit", "1", "--cursor", cursor)
    lines = out.strip().splitlines()
    assert code == 0 and lines[1].split()[1] == "b-2" and not lines[-1].startswith("more")

    async def filled() -> None:
        async with buyer.client(shared_mesh.gateway.address) as client:
            await eventually(client.fill_history, lambda fills: len(fills) == 1)

    asyncio.run(filled())
    code, out, _ = oms_client(capsys, "fills")
    header, row = out.strip().splitlines()
    assert code == 0 and header.split()[:2] == ["time", "ms"]
    assert "30000 ETH" in row and "b-1" in row and "taker" in row
    code, _, err = oms_client(capsys, "order", "--order-id", "s1:999999:1")
    assert code == 1 and err.startswith("refused: ORDER_NOT_FOUND")
