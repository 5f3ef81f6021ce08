"""Shard results as the client sees them, and client requests as shard commands."""

from __future__ import annotations

from protos.oms.v1 import common_pb2, gateway_pb2, shard_pb2

RETRYABLE_REASONS = frozenset(
    {shard_pb2.SHARD_REJECT_REASON_RATE_LIMITED, shard_pb2.SHARD_REJECT_REASON_BACKPRESSURE}
)


def place_command(request: gateway_pb2.PlaceOrderRequest) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    place = command.place
    place.user_id = request.user_id
    place.client_order_id = request.client_order_id
    place.symbol = request.symbol
    place.side = request.side
    place.order_type = request.order_type
    place.time_in_force = request.time_in_force
    place.price_ticks = request.price_ticks
    place.quantity_lots = request.quantity_lots
    place.quote_amount = request.quote_amount
    place.expire_at_ms = request.expire_at_ms
    place.self_trade_prevention = request.self_trade_prevention
    return command


def cancel_command(request: gateway_pb2.CancelOrderRequest) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.cancel.user_id = request.user_id
    command.cancel.order_id = request.order_id
    command.cancel.client_order_id = request.client_order_id
    return command


def cancel_all_command(request: gateway_pb2.CancelAllOrdersRequest) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.cancel_all.user_id = request.user_id
    command.cancel_all.symbol = request.symbol
    return command


def cancel_all_after_command(
    request: gateway_pb2.CancelAllAfterRequest,
) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.cancel_all_after.user_id = request.user_id
    command.cancel_all_after.timeout_ms = request.timeout_ms
    return command


def transfer_command(
    request: gateway_pb2.TransferRequest, *, deposit: bool
) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    transfer = command.deposit if deposit else command.withdraw
    transfer.user_id = request.user_id
    transfer.asset = request.asset
    transfer.amount = request.amount
    transfer.transfer_id = request.transfer_id
    return command


def order_ack(client_order_id: str, result: shard_pb2.ShardResult) -> gateway_pb2.OrderAck:
    ack = gateway_pb2.OrderAck(
        accepted=result.accepted,
        order_id=result.order_id,
        client_order_id=client_order_id,
        status=result.status,
        reject_reason=result.reject_reason,
        matcher_reason=result.matcher_reason,
        retryable=result.retryable or result.reject_reason in RETRYABLE_REASONS,
        duplicate=result.duplicate,
    )
    ack.stamp.CopyFrom(result.stamp)
    if not result.accepted and not ack.status:
        ack.status = common_pb2.ORDER_STATUS_REJECTED
    return ack


def cancel_ack(result: shard_pb2.ShardResult) -> gateway_pb2.CancelAck:
    ack = gateway_pb2.CancelAck(
        accepted=result.accepted, order_id=result.order_id, reject_reason=result.reject_reason
    )
    ack.stamp.CopyFrom(result.stamp)
    return ack


def cancel_all_ack(result: shard_pb2.ShardResult) -> gateway_pb2.CancelAllAck:
    ack = gateway_pb2.CancelAllAck(
        accepted=result.accepted,
        cancelled_order_ids=result.cancelled_order_ids,
        already_cancelling=result.already_cancelling,
        reject_reason=result.reject_reason,
        retryable=result.retryable or result.reject_reason in RETRYABLE_REASONS,
    )
    ack.stamp.CopyFrom(result.stamp)
    return ack


def cancel_all_after_ack(result: shard_pb2.ShardResult) -> gateway_pb2.CancelAllAfterAck:
    ack = gateway_pb2.CancelAllAfterAck(
        accepted=result.accepted,
        cancel_all_at_ms=result.cancel_all_at_ms,
        reject_reason=result.reject_reason,
        retryable=result.retryable or result.reject_reason in RETRYABLE_REASONS,
    )
    ack.stamp.CopyFrom(result.stamp)
    return ack


def transfer_ack(result: shard_pb2.ShardResult) -> gateway_pb2.TransferAck:
    ack = gateway_pb2.TransferAck(
        accepted=result.accepted, reject_reason=result.reject_reason, duplicate=result.duplicate
    )
    ack.stamp.CopyFrom(result.stamp)
    return ack
