"""The gateway between the simulated clients and the shard groups, on the gateway's own code.

What runs for real (`gateway/core/`, the same functions the gateway's handlers call):
each request is checked (`RequestValidator`: an invalid one refused with its reason,
nothing sent; a cancel-all's symbol by `symbol_filter`, as `cancel_all_orders` does),
turned into the shard command (`place_command`, `cancel_command`, `cancel_all_command`,
`transfer_command`), a place or a cancel stamped with the routing epoch it was routed
by (as `ShardRouter.execute`: a cancel-all's epoch is left unset), and the shard's
result turned into the client's ack (`order_ack`, `cancel_ack`, `cancel_all_ack`,
`transfer_ack`); a NOT_OWNER answer is followed as `after_not_owner` decides. Each
cancel-all sent is told to the run's `CancelAllCheck` with the symbol the client asked
for.

What is modelled, as `gateway/routing.py` and `gateway/etcd_routing.py` run it: the
gateway's routing is its own copy of the routing document, which its etcd watch
delivers a little after each change, in order; a user in transit, or a NOT_OWNER
from a shard that decided under a newer epoch (or the same), waits up to
`WATCH_GRACE_MS` for the watch, then reads the document from etcd itself. If routing
moved past the epoch used, the call is routed again; if not, the client hears the
shard's NOT_OWNER (retryable), and a user still in transit is waited for again until
`REROUTE_MS` is spent (UNAVAILABLE). A shard behind the gateway's epoch is asked
again `LAGGING_SHARD_WAIT_MS` later.
Parked results are not the client's: the final one follows. The admin API's
operator controls are sent as before (`operator_model.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.core.acks import (
    cancel_ack,
    cancel_all_ack,
    cancel_all_command,
    cancel_command,
    order_ack,
    place_command,
    transfer_ack,
    transfer_command,
)
from gateway.core.refusals import GatewayError, unavailable
from gateway.core.rerouting import NotOwnerStep, after_not_owner
from gateway.core.validation import RequestValidator
from protos.oms.v1 import gateway_pb2, shard_pb2
from services.markets.catalog import MarketCatalog
from services.routing.core.routing_document import RoutingDocument
from services.shard.core.codec import egress_to_protobuf
from services.shard.core.egress import ShardResult
from simulation.core.defects import CANCEL_ALL_IGNORES_SYMBOL

if TYPE_CHECKING:
    from simulation.core.world import SimWorld

REROUTE_MS = 2_000  # `GatewaySettings.reroute_ms`
WATCH_GRACE_MS = 200  # `etcd_routing.WATCH_GRACE_S`
LAGGING_SHARD_WAIT_MS = 20  # `routing.LAGGING_SHARD_WAIT_S`
WATCH_LAG_MS = (1, 30)  # a routing change reaches the gateway's watch this much later
PLACE, CANCEL, CANCEL_ALL = "place", "cancel", "cancel-all"
DEPOSIT, WITHDRAW = "deposit", "withdraw"

Answer = Callable[[Any], None]  # an ack (`gateway_pb2`), or the `GatewayError` refusing it


@dataclass(slots=True)
class Routed:
    """One client call in the gateway: its command, and where it was last sent."""

    kind: str
    user_id: int
    command: shard_pb2.ShardCommand
    client_order_id: str
    answer: Answer
    deadline_ms: int  # the re-routing budget's end
    epoch: int = 0  # the routing epoch it was last routed by
    wait: int = 0  # counts its waits for a newer epoch: a stale wait's timer does nothing
    symbol: str = ""  # a cancel-all's symbol, as the client asked ("": every symbol)


class SimGateway:
    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.routing: RoutingDocument = world.routing  # as its watch last delivered it
        self.validator = RequestValidator(
            MarketCatalog(world.markets), wall_clock_ms=lambda: world.scheduler.now_ms
        )
        self.in_flight: dict[int, Routed] = {}  # correlation -> the call it was sent for
        self.waiting: list[Routed] = []  # calls waiting for a newer routing epoch
        self._delivered_at_ms = 0  # the watch delivers changes in order
        self.figures: Counter[str] = Counter()

    # --- routing ------------------------------------------------------------------------

    def routing_changed(self, document: RoutingDocument) -> None:
        """A new epoch in etcd: the gateway's watch delivers it a little later, in order."""
        world = self.world
        at = max(world.scheduler.now_ms + world.rng.randrange(*WATCH_LAG_MS), self._delivered_at_ms)
        self._delivered_at_ms = at
        world.scheduler.at(at, "gateway routing", lambda: self._install(document))

    def _install(self, document: RoutingDocument) -> None:
        if document.epoch <= self.routing.epoch:
            return
        self.routing = document
        waiting, self.waiting = self.waiting, []
        for routed in waiting:
            self._route(routed)

    # --- calls --------------------------------------------------------------------------

    def call(self, kind: str, request: Any, answer: Answer) -> None:
        """A client's request: checked, translated, routed; `answer` gets the ack or the
        refusal (once, unless the client gave up on it first)."""
        try:
            command = self._command(kind, request)
        except GatewayError as error:
            reason = error.reason_name.removeprefix("GATEWAY_ERROR_REASON_")
            self.figures[f"gateway_refused_{reason}"] += 1
            answer(error)
            return
        client_order_id = request.client_order_id if kind == PLACE else ""
        symbol = request.symbol if kind == CANCEL_ALL else ""
        deadline_ms = self.world.scheduler.now_ms + REROUTE_MS
        self._route(
            Routed(
                kind, request.user_id, command, client_order_id, answer, deadline_ms, symbol=symbol
            )
        )

    def _command(self, kind: str, request: Any) -> shard_pb2.ShardCommand:
        validator = self.validator
        if kind == PLACE:
            validator.place(request)
            return place_command(request)
        if kind == CANCEL:
            validator.order_reference(request.order_id, request.client_order_id)
            return cancel_command(request)
        if kind == CANCEL_ALL:
            validator.symbol_filter(request.symbol)
            command = cancel_all_command(request)
            if self.world.config.defect == CANCEL_ALL_IGNORES_SYMBOL:
                command.cancel_all.symbol = ""
            return command
        validator.transfer(request)
        return transfer_command(request, deposit=kind == DEPOSIT)

    def _route(self, routed: Routed) -> None:
        """As `ShardRouter.execute`: the owner under the gateway's epoch, or a wait."""
        world = self.world
        owner = self.routing.owner_of(routed.user_id)
        if owner is None:
            self.figures["gateway_in_transit_waits"] += 1
            self._await_newer_epoch(routed, self.routing.epoch)
            return
        routed.epoch = self.routing.epoch
        command = routed.command
        if routed.kind == PLACE:
            command.place.routing_epoch = routed.epoch
        elif routed.kind == CANCEL:
            command.cancel.routing_epoch = routed.epoch
        correlation = world.new_correlation()
        command.correlation_id = correlation
        self.in_flight[correlation] = routed
        if routed.kind == CANCEL_ALL:
            world.cancel_all_check.expect(correlation, routed.user_id, routed.symbol)
        sent = shard_pb2.ShardCommand()
        sent.CopyFrom(command)  # this copy travels; the call's may be routed again
        world.send_command(owner, sent)
        # The shard link's deadline: an answer never coming (lost, or a leader gone) is
        # not waited for beyond the client's own.
        world.scheduler.after(REROUTE_MS, "gateway deadline", lambda: self._forget(correlation))

    def _forget(self, correlation: int) -> None:
        self.in_flight.pop(correlation, None)

    def _await_newer_epoch(
        self, routed: Routed, epoch: int, refusal: shard_pb2.ShardResult | None = None
    ) -> None:
        """`newer_epoch`: wait for the watch to deliver an epoch past `epoch`, at most
        `WATCH_GRACE_MS`, then read the document from etcd; route again if it moved.
        If not: the shard's `refusal` (NOT_OWNER) goes to the client, or, for a user in
        transit, it waits again until the re-routing budget is spent (UNAVAILABLE)."""
        world = self.world
        if self.routing.epoch > epoch:
            self._route(routed)
            return
        routed.wait += 1
        wait = routed.wait
        self.waiting.append(routed)  # `_install` routes it again when the watch delivers

        def grace_over() -> None:
            if routed.wait != wait or routed not in self.waiting:
                return  # the watch delivered a newer epoch meanwhile
            self.waiting.remove(routed)
            self.figures["gateway_routing_reads"] += 1
            if world.routing.epoch > self.routing.epoch:
                self._install(world.routing)  # read from etcd itself: every waiter wakes
            if self.routing.epoch > epoch:
                self._route(routed)
            elif refusal is not None:
                routed.answer(self._ack(routed, refusal))
            elif world.scheduler.now_ms < routed.deadline_ms:
                self._await_newer_epoch(routed, epoch)
            else:
                self.figures["gateway_unavailable_in_transit"] += 1
                routed.answer(unavailable(f"user {routed.user_id} is moving between shards"))

        world.scheduler.after(WATCH_GRACE_MS, "gateway routing read", grace_over)

    # --- answers ------------------------------------------------------------------------

    def on_result(self, result: ShardResult) -> None:
        """A shard's answer to a command the gateway sent (or a late copy: dropped)."""
        if result.parked:
            return  # the final answer follows
        routed = self.in_flight.pop(result.correlation_id, None)
        if routed is None:
            return
        message = egress_to_protobuf(result, 0, 0).result
        if message.reject_reason == shard_pb2.SHARD_REJECT_REASON_NOT_OWNER:
            self.figures["gateway_not_owner"] += 1
            step = after_not_owner(
                shard_epoch=message.routing_epoch,
                routed_epoch=routed.epoch,
                budget_spent=self.world.scheduler.now_ms >= routed.deadline_ms,
            )
            if step is NotOwnerStep.ASK_AGAIN:
                self.figures["gateway_shard_epoch_behind"] += 1
                self.world.scheduler.after(
                    LAGGING_SHARD_WAIT_MS, "gateway reroute", lambda: self._route(routed)
                )
                return
            if step is NotOwnerStep.AWAIT_NEWER_EPOCH:
                self._await_newer_epoch(routed, routed.epoch, refusal=message)
                return
        routed.answer(self._ack(routed, message))

    @staticmethod
    def _ack(routed: Routed, result: shard_pb2.ShardResult) -> Any:
        if routed.kind == PLACE:
            return order_ack(routed.client_order_id, result)
        if routed.kind == CANCEL:
            return cancel_ack(result)
        if routed.kind == CANCEL_ALL:
            return cancel_all_ack(result)
        return transfer_ack(result)


def refusal_is_retryable(error: GatewayError) -> bool:
    """What the client library retries (`client_waits.py`): the mesh not answering."""
    return error.reason in (
        gateway_pb2.GATEWAY_ERROR_REASON_UNAVAILABLE,
        gateway_pb2.GATEWAY_ERROR_REASON_TIMEOUT,
    )
