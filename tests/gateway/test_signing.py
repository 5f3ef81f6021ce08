"""The signing scheme of gateway.proto, pinned: one known vector and what it binds."""

from __future__ import annotations

import hashlib
import hmac

from gateway.signing import (
    API_KEY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature,
    signature_matches,
    signed_body,
    signed_metadata,
)
from protos.oms.v1 import common_pb2, gateway_pb2

PLACE = "/oms.v1.OrderGateway/PlaceOrder"
TRADE = "/oms.v1.OrderGateway/Trade"


def _request() -> gateway_pb2.PlaceOrderRequest:
    return gateway_pb2.PlaceOrderRequest(
        user_id=7,
        client_order_id="c-1",
        symbol="BTC-USDT",
        side=common_pb2.SIDE_BUY,
        order_type=common_pb2.ORDER_TYPE_LIMIT,
        price_ticks=6_500_000,
        quantity_lots=3,
    )


def test_signature_is_hmac_sha256_over_timestamp_method_and_deterministic_body() -> None:
    request = _request()
    body = request.SerializeToString(deterministic=True)
    text = b"1700000000000\n" + PLACE.encode() + b"\n" + body
    expected = hmac.new(b"secret", text, hashlib.sha256).hexdigest()
    assert signed_body(PLACE, request) == body
    assert signature("secret", 1_700_000_000_000, PLACE, body) == expected
    assert dict(signed_metadata("k-1", "secret", PLACE, request, 1_700_000_000_000)) == {
        API_KEY_HEADER: "k-1",
        TIMESTAMP_HEADER: "1700000000000",
        SIGNATURE_HEADER: expected,
    }


def test_signature_binds_body_method_timestamp_and_secret() -> None:
    body = signed_body(PLACE, _request())
    original = signature("secret", 1_000, PLACE, body)
    other_body = _request()
    other_body.quantity_lots = 4
    assert signature("secret", 1_000, PLACE, signed_body(PLACE, other_body)) != original
    assert signature("secret", 1_000, "/oms.v1.OrderGateway/CancelOrder", body) != original
    assert signature("secret", 1_001, PLACE, body) != original
    assert signature("secret2", 1_000, PLACE, body) != original


def test_streams_are_signed_with_an_empty_body() -> None:
    assert signed_body(TRADE, gateway_pb2.TradeRequestBatch()) == b""
    assert signed_body("/oms.v1.OrderGateway/StreamOrderUpdates", None) == b""


def test_comparison_accepts_upper_case_hex_and_refuses_garbage() -> None:
    expected = signature("secret", 1, PLACE, b"")
    assert signature_matches(expected, expected.upper())
    assert not signature_matches(expected, expected[:-1])
    assert not signature_matches(expected, "é" * 64)
    assert not signature_matches(expected, "")
