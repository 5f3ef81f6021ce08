"""A Trade request sent straight into its shard's link and answered from a callback.

On the Trade stream an order usually needs no coroutine of its own: it is not traced,
its user's cluster is known, and the shard's link is up. Then the session puts the
command into the link (`submit_directly`) and answers from the result future's
done-callback (`DirectOrder.response`): no task, no coroutine frames and no extra
loop step per request, which at 1,000 orders/s were a visible share of the gateway's
CPU. Anything else takes the routed path (`OrderService.place` / `cancel` in a task):
a traced order, a user in transit, a link that is away (the routed path may start a
connection attempt and wait for it), and a NOT_OWNER answer (the routed path follows
the routing to the new owner, with the same ids). The client sees the same answers
either way: the same acks, and a link failure as the same UNAVAILABLE or TIMEOUT.
"""

from __future__ import annotations

import asyncio

from gateway.core.acks import cancel_ack, cancel_command, order_ack, place_command
from gateway.core.refusals import GatewayError
from gateway.routing import ShardRouter
from gateway.shard_endpoint import ShardEndpoint
from gateway.statistics import GatewayCounters
from protos.oms.v1 import gateway_pb2, shard_pb2
from services.clients.shard_link import ShardUnavailableError
from services.observability.tracing import tracing_enabled

NOT_OWNER = shard_pb2.SHARD_REJECT_REASON_NOT_OWNER


class DirectOrder:
    """One request in its shard's link. Also the handle the session's deadline sweep
    holds: `cancel` reaches whichever is answering it, the link's future or, after a
    NOT_OWNER, the routed path's task."""

    __slots__ = ("answered", "deadline", "fallback", "future", "request", "shard")

    def __init__(
        self,
        request: gateway_pb2.TradeRequest,
        shard: ShardEndpoint,
        future: asyncio.Future[shard_pb2.ShardResult],
        deadline: float,
    ) -> None:
        self.request = request
        self.shard = shard
        self.future = future
        self.deadline = deadline  # loop time
        self.fallback: asyncio.Task[None] | None = None
        self.answered = False

    def done(self) -> bool:
        """Answered (by the callback, or by the routed path's task after NOT_OWNER)."""
        return self.answered or (self.fallback is not None and self.fallback.done())

    def cancel(self, message: str) -> None:
        (self.fallback or self.future).cancel(message)

    def response(self, counters: GatewayCounters) -> gateway_pb2.TradeResponse | None:
        """The answer, once the future is done and not cancelled; None after NOT_OWNER
        (the routed path answers); a link failure raises its `GatewayError`."""
        try:
            result = self.future.result()
        except (ShardUnavailableError, TimeoutError) as error:
            raise self.shard.link_failure(error) from error
        if result.reject_reason == NOT_OWNER:
            counters.add("shard_not_owner")
            return None
        request = self.request
        response = gateway_pb2.TradeResponse(request_id=request.request_id)
        if request.HasField("place"):
            ack = order_ack(request.place.client_order_id, result)
            counters.add("orders_accepted" if ack.accepted else "orders_refused")
            response.place.CopyFrom(ack)
        else:
            response.cancel.CopyFrom(cancel_ack(result))
        return response


def submit_directly(
    router: ShardRouter, request: gateway_pb2.TradeRequest, deadline: float, session_id: int = 0
) -> DirectOrder | None:
    """The checked request's command in its shard's link, or None: take the routed path."""
    if tracing_enabled():
        return None  # the routed path opens the order's span
    if request.HasField("cancel_all"):
        return None  # rare, and answered with its own ack: the routed path
    placing = request.HasField("place")
    user_id = request.place.user_id if placing else request.cancel.user_id
    try:
        route = router.routing.route(user_id)
    except GatewayError:
        return None  # no routing yet: the routed path says so, counted, as it always has
    if route.cluster is None:
        return None  # in transit: the routed path waits for the next epoch
    if placing:
        command = place_command(request.place)
        command.place.routing_epoch = route.epoch
        command.place.session_id = session_id
    else:
        command = cancel_command(request.cancel)
        command.cancel.routing_epoch = route.epoch
    future = route.cluster.shard.submit(command)
    if future is None:
        return None
    return DirectOrder(request, route.cluster.shard, future, deadline)
