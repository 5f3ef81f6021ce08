"""`oms client instruments|book|trades|ticker|candles` against a real mesh (`oms up
--plaintext`), each run as a user runs it: a subprocess finding the mesh's market-data
service in the state folder (`OMS_STATE_DIR`), or named with `--market-data`.

The demo trades once on the module's mesh (trade 1: 0.3 BTC at 65,000); then bob
offers, alice bids and buys with `oms client place`, while `book --follow` and
`trades --follow` print each change; what the one-shot commands print afterwards is
checked figure by figure in the assets' units (and in integers with `--raw`). A second
market-data service that is not public (OMS_MARKETDATA_PUBLIC=false) takes the key
options the other client commands take.
"""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.command_line import main
from services.mesh.mesh_record import read_mesh_record
from tests.mesh.up_process import (
    ROOT,
    TOOL_TIMEOUT_S,
    Ran,
    RunningMesh,
    output_lines,
    run_demo,
    running_up,
)
from tests.server_folders import server_reachable_folder
from tests.service_process import ServiceProcess

pytestmark = pytest.mark.slow

SYMBOL = "BTC-USDT"
FOLLOW_WAIT_S = 60.0  # a loaded machine: the order's trip through shard, bridge, matcher
CANDLES_WAIT_S = 60.0  # the persister writes the fills behind the shard
STOP_WAIT_S = 20.0
POLL_S = 0.2


@dataclass(frozen=True)
class Trader:
    user_id: int
    api_key: str
    api_secret: str

    def key(self) -> tuple[str, ...]:
        return ("--api-key", self.api_key, f"--api-secret={self.api_secret}")

    def signed(self) -> tuple[str, ...]:
        return ("client", "--user-id", str(self.user_id), *self.key())


@dataclass
class Traded:
    """The module's mesh after the trades, and what the followers printed meanwhile."""

    mesh: RunningMesh
    alice: Trader
    bob: Trader
    book_lines: list[str]
    book_exit: int
    book_err: str
    trade_lines: list[str]
    trades_exit: int
    trades_err: str


def oms(environment: Mapping[str, str], *arguments: str) -> Ran:
    done = subprocess.run(
        [sys.executable, "-m", "services.command_line", *arguments],
        check=False,
        capture_output=True,
        text=True,
        env=dict(environment),
        cwd=ROOT,
        timeout=TOOL_TIMEOUT_S,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


def answered(ran: Ran, code: int = 0) -> str:
    """What a command printed on stdout, checked: its exit status, no traceback."""
    assert ran.code == code, ran.printed
    assert "Traceback" not in ran.printed, ran.printed
    return ran.out


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def new_key(mesh: RunningMesh, user_id: int, *scopes: str) -> Trader:
    flags = [f"--scope={scope}" for scope in scopes]
    created = answered(mesh.oms("client", "--user-id", str(user_id), "keys", "create", *flags))
    api_key = created.split()[0]
    api_secret = created.split("secret (shown once): ")[1].split()[0]
    return Trader(user_id, api_key, api_secret)


def place(mesh: RunningMesh, trader: Trader, side: str, lots: int, price_ticks: int) -> None:
    shown = answered(
        mesh.oms(*trader.signed(), "place", SYMBOL, side, str(lots), "--price", str(price_ticks))
    )
    assert shown.startswith("accepted"), shown


@contextlib.contextmanager
def following(
    environment: Mapping[str, str], *arguments: str
) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    """`oms ARGUMENTS` left running, its output read line by line; killed if the block
    did not stop it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "services.command_line", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(environment),
        cwd=ROOT,
    )
    try:
        yield process, output_lines(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(STOP_WAIT_S)


def wait_for(
    lines: queue.Queue[str], seen: list[str], found: Callable[[list[str]], bool], what: str
) -> None:
    """Read lines into `seen` until `found(seen)`, within FOLLOW_WAIT_S."""
    deadline = time.monotonic() + FOLLOW_WAIT_S
    while not found(seen):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{what} not printed; printed:\n{''.join(seen)}")
        with contextlib.suppress(queue.Empty):
            seen.append(lines.get(timeout=min(remaining, 1.0)))


def interrupted(process: subprocess.Popen[str]) -> tuple[int, str]:
    """Ctrl-C, as a user stops a --follow: its exit status and stderr."""
    process.send_signal(signal.SIGINT)
    process.wait(STOP_WAIT_S)
    assert process.stderr is not None
    return process.returncode, process.stderr.read()


def has_row(*cells: str) -> Callable[[list[str]], bool]:
    return lambda seen: any(line.split() == list(cells) for line in seen)


@pytest.fixture(scope="module")
def traded() -> Iterator[Traded]:
    with (
        server_reachable_folder("oms-mesh-") as folder,
        running_up(folder / "state", "--plaintext") as mesh,
    ):
        shown = run_demo(mesh.state_dir, mesh.environment)
        users = dict(re.findall(r"(alice|bob) \(user (\d+)\)", shown))
        alice = new_key(mesh, int(users["alice"]))
        bob = new_key(mesh, int(users["bob"]))
        environment = mesh.environment
        with (
            following(environment, "client", "book", SYMBOL, "--follow") as (book, book_out),
            following(environment, "client", "trades", SYMBOL, "--follow") as (trades, trade_out),
        ):
            book_lines: list[str] = []
            trade_lines: list[str] = []
            # The demo left the book empty; both followers print before anything changes.
            wait_for(book_out, book_lines, has_row("the", "book", "is", "empty"), "the empty book")
            wait_for(trade_out, trade_lines, bool, "the trades' header")
            place(mesh, bob, "sell", 1_000, 6_510_000)  # 0.1 BTC at 65,100
            place(mesh, bob, "sell", 500, 6_510_000)
            place(mesh, bob, "sell", 2_000, 6_520_000)  # 0.2 BTC at 65,200
            place(mesh, alice, "buy", 1_500, 6_490_000)  # bids 0.15 BTC at 64,900
            place(mesh, alice, "buy", 700, 6_510_000)  # trade 2: 0.07 BTC at 65,100
            place(mesh, alice, "buy", 400, 6_520_000)  # trades 3 and 4: 0.03 + 0.01 BTC
            wait_for(
                book_out,
                book_lines,
                has_row("1", "0.1500", "64,900.00", "|", "65,100.00", "0.0400", "1"),
                "the book after the trades",
            )
            wait_for(
                book_out, book_lines, has_row("|", "65,200.00", "0.2000", "1"), "the 65,200 offer"
            )
            wait_for(
                trade_out,
                trade_lines,
                lambda seen: any(line.split()[:2] == ["4", "4"] for line in seen),
                "trade 4",
            )
            book_exit, book_err = interrupted(book)
            trades_exit, trades_err = interrupted(trades)
        yield Traded(
            mesh,
            alice,
            bob,
            book_lines,
            book_exit,
            book_err,
            trade_lines,
            trades_exit,
            trades_err,
        )


def test_without_a_mesh_or_an_address_the_commands_say_what_to_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before any call: run in this process.
    for name in ("OMS_STATE_DIR", "OMS_GATEWAY_ADDRESS", "OMS_MARKETDATA_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    assert main(["client", "--state-dir", str(tmp_path), "instruments"]) == 2
    said = capsys.readouterr().err
    assert f"no mesh under {tmp_path}" in said and "--market-data" in said, said
    assert main(["client", "--gateway", "127.0.0.1:1", "ticker"]) == 2
    said = capsys.readouterr().err
    assert "name its mesh's market-data service too" in said, said
    named = ["client", "--market-data", "127.0.0.1:1"]
    assert main([*named, "candles", SYMBOL, "--from", "soon"]) == 2
    assert "'soon' is not a time" in capsys.readouterr().err
    assert main([*named, "--api-key", "ak_1", "instruments"]) == 2
    assert "--api-secret" in capsys.readouterr().err


def test_the_followers_printed_each_change_and_stopped_at_ctrl_c(traded: Traded) -> None:
    assert traded.book_exit == 0, traded.book_err
    assert "Traceback" not in traded.book_err, traded.book_err
    titles = [line for line in traded.book_lines if line.startswith(f"{SYMBOL} TRADING")]
    sequences = [int(re.findall(r"book sequence (\d+)", title)[0]) for title in titles]
    # The empty book, then one table per change (the six orders' rests and takes; a
    # diff may carry several updates): each later than the one before.
    assert len(sequences) >= 2 and sequences == sorted(set(sequences)), titles
    assert traded.trades_exit == 0, traded.trades_err
    trades = [line.split() for line in traded.trade_lines[1:]]
    assert traded.trade_lines[0].split()[:2] == ["sequence", "trade"], traded.trade_lines
    assert [(t[0], t[4], t[5], t[6]) for t in trades] == [
        ("1", "BUY", "65,000.00", "0.3000"),
        ("2", "BUY", "65,100.00", "0.0700"),
        ("3", "BUY", "65,100.00", "0.0300"),
        ("4", "BUY", "65,100.00", "0.0100"),
    ], traded.trade_lines
    # Trade 1 was the only one when it started: sent first, as a recent trade held.


def test_instruments_in_the_assets_units_and_raw(traded: Traded) -> None:
    mesh = traded.mesh
    table = rows(answered(mesh.oms("client", "instruments")))
    assert table[0] == [
        "symbol",
        "status",
        "lot",
        "price",
        "step",
        "min",
        "notional",
        "price",
        "band",
        "reference",
        "price",
        "maker",
        "fee",
        "taker",
        "fee",
    ], table
    by_symbol = {row[0]: row for row in table[1:]}
    assert by_symbol[SYMBOL] == [
        SYMBOL,
        "TRADING",
        "0.0001",
        "BTC",
        "0.01",
        "USDT",
        "1.00",
        "USDT",
        "±10%",
        "65,000.00",
        "USDT",
        "0.1%",
        "0.2%",
    ], table
    assert by_symbol["SOL-USDT"][2:6] == ["0.001", "SOL", "0.001", "USDT"], table
    raw = {row[0]: row for row in rows(answered(mesh.oms("client", "instruments", "--raw")))}
    assert raw[SYMBOL][1:] == [
        "TRADING",
        "BTC",
        "USDT",
        "10000",
        "1",
        "1000000",
        "1000",
        "6500000",
        "1000",
        "2000",
    ], raw


def test_the_book_two_sided_in_the_assets_units(traded: Traded) -> None:
    mesh = traded.mesh
    shown = answered(mesh.oms("client", "book", SYMBOL)).splitlines()
    assert re.fullmatch(
        r"BTC-USDT TRADING, book sequence \d+, trade sequence 4, at \S+ \S+ UTC", shown[0]
    ), shown
    assert shown[1] == "prices in USDT per BTC (1 tick = 0.01), sizes in BTC (1 lot = 0.0001)"
    header = " ".join(shown[2].split())
    assert header == "orders bid size BTC bid USDT | ask USDT ask size BTC orders", shown
    assert rows("\n".join(shown[3:])) == [
        ["1", "0.1500", "64,900.00", "|", "65,100.00", "0.0400", "1"],
        ["|", "65,200.00", "0.2000", "1"],
    ], shown
    raw = answered(mesh.oms("client", "book", SYMBOL, "--depth", "1", "--raw")).splitlines()
    assert rows("\n".join(raw[3:])) == [["1", "1500", "6490000", "|", "6510000", "400", "1"]], raw
    refused = mesh.oms("client", "book", "DOGE-USDT")
    assert refused.code == 1 and "no instrument 'DOGE-USDT'" in refused.err, refused.printed


def test_recent_trades_and_trades_after_a_sequence(traded: Traded) -> None:
    mesh = traded.mesh
    recent = mesh.oms("client", "trades", SYMBOL)
    shown = rows(answered(recent))
    assert shown[0] == [
        "sequence",
        "trade",
        "id",
        "time",
        "UTC",
        "taker",
        "price",
        "USDT",
        "size",
        "BTC",
    ]
    assert [(row[0], row[4], row[5], row[6]) for row in shown[1:]] == [
        ("1", "BUY", "65,000.00", "0.3000"),
        ("2", "BUY", "65,100.00", "0.0700"),
        ("3", "BUY", "65,100.00", "0.0300"),
        ("4", "BUY", "65,100.00", "0.0100"),
    ], shown  # fmt: skip
    last_two = rows(answered(mesh.oms("client", "trades", SYMBOL, "--limit", "2", "--raw")))
    assert [(row[0], row[3], row[4], row[5]) for row in last_two[1:]] == [
        ("3", "BUY", "6510000", "300"),
        ("4", "BUY", "6510000", "100"),
    ], last_two
    after_three = rows(answered(mesh.oms("client", "trades", SYMBOL, "--from", "3")))
    assert [row[0] for row in after_three[1:]] == ["4"], after_three
    caught_up = answered(mesh.oms("client", "trades", SYMBOL, "--from", "4"))
    assert caught_up.strip() == "no trades after 4 (the newest is 4)", caught_up
    assert answered(mesh.oms("client", "trades", "ETH-USDT")).strip() == "no trades yet"


def test_the_ticker_of_one_symbol_and_of_all(traded: Traded) -> None:
    mesh = traded.mesh
    one = rows(answered(mesh.oms("client", "ticker", SYMBOL)))
    assert [cell.rstrip("*") for cell in one[1]] == [
        SYMBOL,
        "TRADING",
        "65,100.00",  # last
        "64,900.00",  # best bid, 0.15 BTC
        "0.1500",
        "65,100.00",  # best ask, 0.04 BTC
        "0.0400",
        "65,000.00",  # the 24 hours: open, high, low
        "65,100.00",
        "65,000.00",
        "0.4100",  # 0.3 + 0.07 + 0.03 + 0.01 BTC
        "BTC",
        "26,661.00",  # 19,500 + 0.11 x 65,100 USDT
        "USDT",
        "4",
    ], one
    every = {row[0]: row for row in rows(answered(mesh.oms("client", "ticker")))[1:]}
    assert every["ETH-USDT"][1:3] == ["TRADING", "-"], every
    assert every["SOL-USDT"][1:3] == ["TRADING", "-"], every
    raw = rows(answered(mesh.oms("client", "ticker", SYMBOL, "--raw")))
    assert raw[1][2:7] == ["6510000", "6490000", "1500", "6510000", "400"], raw


def test_candles_from_the_fills(traded: Traded) -> None:
    mesh = traded.mesh
    deadline = time.monotonic() + CANDLES_WAIT_S
    while True:  # the persister writes the fills behind the shard: until all four are in
        shown = answered(mesh.oms("client", "candles", SYMBOL, "--raw", "--from", "2h"))
        candles = [row for row in rows(shown) if row and row[0].isdigit()]
        if sum(int(row[5]) for row in candles) == 4_100 or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    assert sum(int(row[5]) for row in candles) == 4_100, shown
    assert sum(int(row[7]) for row in candles) == 4, shown
    assert all(int(row[0]) % 60_000 == 0 for row in candles), shown
    assert {row[2] for row in candles} <= {"6500000", "6510000"}, shown  # the highs
    daily = answered(mesh.oms("client", "candles", SYMBOL, "--interval", "1d", "--from", "2d"))
    lines = daily.splitlines()
    assert lines[0] == "prices in USDT per BTC (1 tick = 0.01), sizes in BTC (1 lot = 0.0001)"
    assert lines[1].split() == [
        "open", "time", "UTC", "open", "high", "low", "close",
        "volume", "BTC", "quote", "volume", "USDT", "trades",
    ], daily  # fmt: skip
    days = rows("\n".join(lines[2:]))
    # One UTC day, or two when the test ran across midnight.
    assert sum(int(day[-1]) for day in days) == 4, daily
    assert all(day[1].endswith("00:00") for day in days), daily


class PrivateMarketData(ServiceProcess):
    """A second `oms marketdata` on the mesh, not public: every call signed."""

    subcommand = "marketdata"
    service_name = "oms.v1.MarketData"


def test_market_data_that_is_not_public_takes_the_client_key_options(
    traded: Traded, tmp_path: Path
) -> None:
    mesh, alice = traded.mesh, traded.alice
    record = read_mesh_record(mesh.state_dir)
    assert record is not None
    private = PrivateMarketData(
        tmp_path / "marketdata",
        environment={
            "OMS_MATCHERS": record.matcher_setting(),
            "OMS_MARKETDATA_PERSISTER": record.persister,
            "OMS_MARKETDATA_PUBLIC": "false",
        },
    )
    with private:
        named = ("client", "--market-data", private.address)
        unsigned = mesh.oms(*named, "ticker", SYMBOL)
        assert unsigned.code == 1, unsigned.printed
        assert unsigned.err.startswith("oms client: refused: MISSING_CREDENTIALS"), unsigned.err
        # Signed by alice's key (READ and TRADE): the flags, or the environment. A new
        # service shows a symbol UNKNOWN until it read the book from the matcher group.
        deadline = time.monotonic() + FOLLOW_WAIT_S
        while True:
            signed = rows(answered(mesh.oms(*named, *alice.key(), "ticker", SYMBOL)))
            if signed[1][1] != "UNKNOWN" or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        assert signed[1][:3] == [SYMBOL, "TRADING", "65,100.00"], signed
        environment = {
            **mesh.environment,
            "OMS_MARKETDATA_ADDRESS": private.address,
            "OMS_API_KEY": alice.api_key,
            "OMS_API_SECRET": alice.api_secret,
        }
        book = answered(oms(environment, "client", "book", SYMBOL)).splitlines()
        assert book[3].split() == ["1", "0.1500", "64,900.00", "|", "65,100.00", "0.0400", "1"]
        wrong = mesh.oms(*named, "--api-key", alice.api_key, "--api-secret", "wrong", "ticker")
        assert wrong.code == 1 and "refused: BAD_SIGNATURE" in wrong.err, wrong.printed
        trading_only = new_key(mesh, alice.user_id, "trade")
        scoped = mesh.oms(*named, *trading_only.key(), "instruments")
        assert scoped.code == 1 and "refused: SCOPE_REQUIRED" in scoped.err, scoped.printed
