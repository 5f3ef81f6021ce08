"""Cancel-on-disconnect sessions in the shard: `KeepSession`, `EndSession`, and places on them.

From state-machine version 3. A session is opened and kept alive by `KeepSession`; an
order placed with its `session_id` belongs to it. When the session is not kept alive
in time (the gateway or its client is gone), the shard's timer ends it and cancels its
live orders, and only those; `EndSession` ends it cleanly (its orders rest on) or not
(they are cancelled). A place on a session the shard does not hold is refused
SESSION_CLOSED. Before version 3 the session commands are refused MALFORMED and a
place's session is ignored, as a build without sessions decides.
"""

from __future__ import annotations

from services.shard.core import snapshot as snapshot_module
from services.shard.core.commands import EndSession, KeepSession, PlaceOrder
from services.shard.core.egress import BeginDehydrate, CancelToMatcher, ShardResult
from services.shard.core.vocabulary import EventKind, RejectReason
from tests.shard.support import TTL_MS, ShardDriver, of_type, only, results

TIMEOUT_MS = 5_000


def driver_at(version: int) -> ShardDriver:
    driver = ShardDriver()
    driver.machine.activate_version(version)
    driver.resident(7, USDT=100_000)
    return driver


def keep(driver: ShardDriver, session_id: int, timeout_ms: int = TIMEOUT_MS) -> KeepSession:
    return KeepSession(driver.next_correlation(), 7, session_id, timeout_ms, 0)


def end(driver: ShardDriver, session_id: int, *, cancel: bool) -> EndSession:
    return EndSession(driver.next_correlation(), 7, session_id, cancel, 0)


def on_session(driver: ShardDriver, client_order_id: str, session_id: int) -> PlaceOrder:
    return driver.place(7, client_order_id)._replace(session_id=session_id)


def accepted_on(driver: ShardDriver, client_order_id: str, session_id: int) -> str:
    result = only(driver.run(on_session(driver, client_order_id, session_id)), ShardResult)
    assert result.accepted, result
    driver.run(driver.events("g1", driver.event("g1", EventKind.ACCEPTED, result.order_id, 7)))
    return result.order_id


def test_an_expired_session_cancels_its_own_orders_and_no_others() -> None:
    driver = driver_at(3)
    opened = only(driver.run(keep(driver, 11)), ShardResult)
    assert opened.accepted and opened.cancel_all_at_ms == driver.now + TIMEOUT_MS
    only(driver.run(keep(driver, 12)), ShardResult)
    mine = [accepted_on(driver, "a", 11), accepted_on(driver, "b", 11)]
    other = accepted_on(driver, "c", 12)
    plain = driver.accepted_order(7, "d")
    driver.tick(advance_ms=TIMEOUT_MS - 1)
    driver.run(keep(driver, 12))  # the other stream's gateway keeps it alive
    expired = driver.tick(advance_ms=1)
    assert [c.order_id for c in of_type(expired, CancelToMatcher)] == mine
    actor = driver.machine.state.actors[7]
    assert list(actor.sessions) == [12]
    assert not actor.orders[other].cancel_in_flight
    assert not actor.orders[plain].cancel_in_flight
    # A place on the expired session is refused: nothing would cancel it.
    refused = only(driver.run(on_session(driver, "late", 11)), ShardResult)
    assert refused.reject_reason == RejectReason.SESSION_CLOSED
    # A clean end leaves its orders resting; a session ended twice is answered alike.
    clean = only(driver.run(end(driver, 12, cancel=False)), ShardResult)
    assert clean.accepted and clean.cancelled_order_ids == ()
    assert not actor.orders[other].cancel_in_flight and not actor.sessions
    assert only(driver.run(end(driver, 12, cancel=True)), ShardResult).cancelled_order_ids == ()


def test_an_unclean_end_cancels_at_once() -> None:
    driver = driver_at(3)
    driver.run(keep(driver, 5))
    order_id = accepted_on(driver, "a", 5)
    out = driver.run(end(driver, 5, cancel=True))
    assert only(out, ShardResult).cancelled_order_ids == (order_id,)
    assert of_type(out, CancelToMatcher) == [CancelToMatcher("g1", order_id, 7)]
    assert of_type(driver.tick(advance_ms=2 * TIMEOUT_MS), CancelToMatcher) == []


def test_refusals_and_the_bound_on_sessions() -> None:
    driver = driver_at(3)
    before = driver.machine.state_hash()
    for command, reason in (
        (keep(driver, 0), RejectReason.MALFORMED),
        (keep(driver, 3, timeout_ms=999), RejectReason.INVALID_TIMEOUT),
        (end(driver, 0, cancel=True), RejectReason.MALFORMED),
    ):
        assert [r.reject_reason for r in results(driver.run(command))] == [reason]
    assert driver.machine.state_hash() == before
    for session_id in range(1, 101):
        assert only(driver.run(keep(driver, session_id)), ShardResult).accepted
    too_many = only(driver.run(keep(driver, 101)), ShardResult)
    assert too_many.reject_reason == RejectReason.TOO_MANY_SESSIONS
    assert only(driver.run(keep(driver, 100)), ShardResult).accepted  # kept alive: fine


def test_a_user_with_a_session_is_not_flat_and_sessions_survive_a_snapshot() -> None:
    driver = driver_at(3)
    driver.run(keep(driver, 9, timeout_ms=600_000))
    order_id = accepted_on(driver, "a", 9)
    assert of_type(driver.tick(advance_ms=5 * TTL_MS), BeginDehydrate) == []
    restored = ShardDriver()
    restored.machine.restore(driver.machine.snapshot())
    assert restored.machine.state_hash() == driver.machine.state_hash()
    assert restored.machine.state.sessions == {(7, 9): driver.now - 5 * TTL_MS + 600_000}
    restored.now = driver.now
    expired = restored.tick(advance_ms=600_000 - 5 * TTL_MS)
    assert [c.order_id for c in of_type(expired, CancelToMatcher)] == [order_id]


def test_an_order_without_a_session_keeps_its_plain_data() -> None:
    driver = driver_at(3)
    driver.run(keep(driver, 4))
    plain = driver.machine.state.actors[7].orders[driver.accepted_order(7, "p")].plain()
    with_session = driver.machine.state.actors[7].orders[accepted_on(driver, "s", 4)].plain()
    request, session_request = plain[1], with_session[1]
    assert isinstance(request, tuple) and isinstance(session_request, tuple)
    assert len(session_request) == len(request) + 1 and session_request[-1] == 4
    item = snapshot_module.item_plain(driver.place(7, "q"))
    assert snapshot_module.item_from_plain(item) == driver.place(7, "q")._replace(
        correlation_id=item[1]
    )


def test_before_version_3_sessions_are_refused_and_a_places_session_ignored() -> None:
    driver = driver_at(2)
    before = driver.machine.state_hash()
    command = keep(driver, 1)
    assert results(driver.run(command)) == [
        ShardResult(command.correlation_id, False, RejectReason.MALFORMED)
    ]
    assert driver.machine.state_hash() == before
    placed = only(driver.run(on_session(driver, "v2", 1)), ShardResult)
    assert placed.accepted
    order = driver.machine.state.actors[7].orders[placed.order_id]
    assert order.request.session_id == 0
