"""Protobuf at the edge: every command survives the bytes path; every egress has a wire form."""

from __future__ import annotations

import dataclasses

from protos.oms.v1 import common_pb2, shard_pb2
from services.matcher.core.codec import spec_from_order
from services.matcher.core.validation import field_reject_reason
from services.shard.core.codec import (
    decode_command,
    egress_to_protobufs,
    encode_command_batch,
    encode_egress_batch,
    user_state_from_protobuf,
    user_state_to_protobuf,
)
from services.shard.core.commands import Command, MalformedCommand, PlaceOrder, ReconciledOrder
from services.shard.core.egress import (
    BeginDehydrate,
    CancelToMatcher,
    DedupLookup,
    Egress,
    FillRecord,
    HydrateRequest,
    LedgerPosting,
    OrderUpdate,
    RiskAlert,
    ShardResult,
    SubmitToMatcher,
)
from services.shard.core.risk import RiskLimits
from services.shard.core.user_state import PositionState, RecentResult, UserState
from services.shard.core.vocabulary import BUY, LIMIT, MARKET, EventKind
from tests.shard.support import ShardDriver, of_type

STATE = UserState(
    user_id=5,
    db_version=3,
    tier=2,
    balances=(("USDT", 10), ("BTC", 2)),
    positions=(PositionState("BTC-USDT", -2, -200, 7),),
    user_seq=9,
    recent=(RecentResult("c", "s1:5:9", 0, 77),),
    risk_limits=RiskLimits(1, 2, 3, 4, 5),
    reduce_only=True,
    peak_equity=11,
)


def test_every_command_round_trips_through_shard_command_bytes() -> None:
    driver = ShardDriver()
    commands: list[Command] = [
        driver.place(1, "a", price_ticks=5, quantity_lots=2, time_in_force=4, expire_at_ms=9),
        driver.cancel(1, order_id="s1:1:1", client_order_id="a"),
        driver.deposit(1, "USDT", 5, "t"),
        driver.withdraw(1, "BTC", 6, "w"),
        driver.hydrate(
            5,
            **{
                k: getattr(STATE, k)
                for k in (
                    "db_version",
                    "tier",
                    "positions",
                    "user_seq",
                    "recent",
                    "risk_limits",
                    "reduce_only",
                    "peak_equity",
                )
            },
            balances=dict(STATE.balances),
            epoch=4,
        ),
        driver.hydrate(6, known=False, epoch=2),
        driver.flush_complete(1, 2, 3),
        driver.flush_refused(1, 2),
        driver.events(
            "g1",
            driver.event("g1", EventKind.ACCEPTED, "s1:1:1", 1),
            driver.event("g1", EventKind.REJECTED, "s1:1:1", 1, reason=7),
            driver.fill("s1:1:1", 1, price_ticks=3, quantity_lots=2, maker=True, done=True),
            driver.event("g1", EventKind.CANCELLED, "s1:1:1", 1, remaining_lots=1, reason=2),
            driver.event("g1", EventKind.EXPIRED, "s1:1:1", 1, remaining_lots=4),
        ),
        driver.marks(BTC_USDT=100, ETH_USDT=7),
        driver.reconcile(1, "g1", 5, [ReconciledOrder("s1:1:1", "BTC-USDT", 1, 2, 3)]),
        driver.dedup_answer(1, "a", RecentResult("a", "s1:1:1", 0, 5)),
        driver.dedup_answer(1, "b", None),
        driver.limits(1, RiskLimits(1, 2, 3, 4, 5), clear=True),
    ]
    batch = shard_pb2.ShardCommandBatch.FromString(encode_command_batch(commands))
    decoded = [decode_command(message) for message in batch.commands]
    assert decoded == commands
    assert [type(c) for c in decoded] == [type(c) for c in commands]


def test_an_empty_command_decodes_as_malformed() -> None:
    decoded = decode_command(shard_pb2.ShardCommand(correlation_id=4))
    assert decoded == MalformedCommand(4, "no command set")


def test_user_state_round_trips() -> None:
    assert user_state_from_protobuf(user_state_to_protobuf(STATE)) == STATE


def test_every_egress_kind_has_a_wire_form_stamped_with_its_log_position() -> None:
    driver = ShardDriver()
    place = driver.place(1, "a")
    items: list[Egress] = [
        ShardResult(1, True, 0, 0, False, True, "s1:1:1", 1, False),
        SubmitToMatcher("g1", "s1:1:1", place),
        CancelToMatcher("g1", "s1:1:1", 1),
        BeginDehydrate(5, 3, STATE),
        HydrateRequest(5, 3),
        DedupLookup(1, "a"),
        OrderUpdate(1, "s1:1:1", "a", "BTC-USDT", 3, 1, 1, 100, 1, 0),
        LedgerPosting("trade:1", ((1, "user", "USDT", -5), (0, "clearing", "USDT", 5))),
        FillRecord("s1:1:1", 1, 9, "BTC-USDT", 1, 100, 1, 2, True),
        RiskAlert(1, "drawdown", "detail"),
    ]
    batch = encode_egress_batch(items, 42, 1_000)
    kinds = [message.WhichOneof("egress") for message in batch.items]
    assert kinds == [
        "result",
        "submit",
        "cancel",
        "begin_dehydrate",
        "hydrate_request",
        "dedup_lookup",
        "order_update",
        "ledger",
        "ledger",
        "fill",
        "risk_alert",
    ]
    assert all(message.stamp.position == 42 for message in batch.items)
    assert batch.items[0].result.stamp.consensus_time_ms == 1_000
    submit = batch.items[1].submit.order
    assert (submit.order_id, submit.user_id, submit.quantity_lots) == ("s1:1:1", 1, 1)
    assert user_state_from_protobuf(batch.items[3].begin_dehydrate.state) == STATE
    assert [m.ledger.amount for m in egress_to_protobufs(items[7], 1, 1)] == [-5, 5]


def test_egress_of_a_real_run_encodes() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10**6)
    order_id = driver.accepted_order(1, "a")
    driver.run(
        driver.events("g1", driver.fill(order_id, 1, price_ticks=100, quantity_lots=1, done=True))
    )
    batch = encode_egress_batch(driver.history, 7, 8)
    assert len(batch.items) >= len(driver.history)
    assert of_type(driver.history, LedgerPosting)


def test_statistics_are_a_frozen_record_the_service_can_export() -> None:
    driver = ShardDriver()
    driver.resident(1, USDT=10)
    stats = driver.machine.statistics()
    assert dataclasses.is_dataclass(stats) and stats.resident_users == 1
    assert stats.counter("hydrations_completed") == 1
    try:
        stats.resident_users = 5  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("statistics must be frozen")


TRACE_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_sampled_order_carries_its_trace_parent_through_the_log_to_the_matcher() -> None:
    driver = ShardDriver()
    driver.run(driver.hydrate(1), driver.deposit(1, "USDT", 10**12))
    traced = driver.place(1, "traced", price_ticks=100, quantity_lots=1)._replace(
        trace_parent=TRACE_PARENT
    )
    egress = driver.run_bytes([traced])  # through ShardCommandBatch bytes, as logged
    (submit,) = of_type(egress, SubmitToMatcher)
    (message,) = egress_to_protobufs(submit, 1, 1)
    assert message.submit.order.trace_parent == TRACE_PARENT
    replica = ShardDriver()
    replica.machine.restore(driver.machine.snapshot())
    assert replica.machine.state_hash() == driver.machine.state_hash()


def test_an_oversized_trace_parent_is_malformed_and_changes_nothing() -> None:
    driver = ShardDriver()
    driver.run(driver.hydrate(1), driver.deposit(1, "USDT", 10**12))
    before = driver.machine.state_hash()
    bloated = driver.place(1, "bloated")._replace(trace_parent="x" * 65)
    egress = driver.run_bytes([bloated])
    (result,) = of_type(egress, ShardResult)
    assert not result.accepted and not of_type(egress, SubmitToMatcher)
    assert driver.machine.state_hash() == before


def test_a_limit_order_without_a_time_in_force_reaches_the_matcher_as_gtc() -> None:
    """Found by `oms sim`: the shard admits such an order as GTC (vocabulary), but sent
    it on unspecified, and the matcher refused it INVALID_ORDER after the client's ack."""
    limit = PlaceOrder(1, 7, "c1", "BTC-USDT", BUY, LIMIT, 0, 100, 2, 0, 0, 0, 0)
    [message] = egress_to_protobufs(SubmitToMatcher("g1", "s1:7:1", limit), 5, 10)
    order = message.submit.order
    assert order.time_in_force == common_pb2.TIME_IN_FORCE_GTC
    assert field_reject_reason(spec_from_order(order)) == 0
    # A market order keeps it unspecified: the matcher takes that (or IOC) for markets.
    market = PlaceOrder(2, 7, "c2", "BTC-USDT", BUY, MARKET, 0, 0, 0, 5_000, 0, 0, 0)
    [message] = egress_to_protobufs(SubmitToMatcher("g1", "s1:7:2", market), 6, 10)
    assert message.submit.order.time_in_force == common_pb2.TIME_IN_FORCE_UNSPECIFIED
    assert field_reject_reason(spec_from_order(message.submit.order)) == 0
