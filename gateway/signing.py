"""Request signing, shared by the gateway and its clients: one place for the scheme.

A request carries three metadata entries (gateway.proto):
  x-oms-api-key:   the key id
  x-oms-timestamp: client wall time in ms
  x-oms-signature: hex HMAC-SHA256(secret, "<timestamp>\\n<full method>\\n" + body)
where body is the request message serialized deterministically, or empty for the
streaming calls (authenticated once, at open). Binding the method into the signed
text stops a signature for one call being replayed against another with the same
bytes; binding the timestamp bounds replays to the server's window.
"""

from __future__ import annotations

import hashlib
import hmac

from google.protobuf.message import Message

API_KEY_HEADER = "x-oms-api-key"
TIMESTAMP_HEADER = "x-oms-timestamp"
SIGNATURE_HEADER = "x-oms-signature"
REASON_TRAILER = "x-oms-reason"

# Methods whose body is the empty string: the stream is signed once, at open.
STREAM_METHODS = frozenset(
    {
        "/oms.v1.OrderGateway/StreamOrderUpdates",
        "/oms.v1.OrderGateway/Trade",
    }
)

Metadata = tuple[tuple[str, str], ...]


def signed_body(method: str, request: Message | None) -> bytes:
    """The bytes a request of `method` is signed over (after the method line)."""
    if method in STREAM_METHODS or request is None:
        return b""
    return request.SerializeToString(deterministic=True)


def signature(secret: str, timestamp_ms: int, method: str, body: bytes) -> str:
    text = f"{timestamp_ms}\n{method}\n".encode() + body
    return hmac.digest(secret.encode(), text, hashlib.sha256).hex()


def signature_matches(expected_hex: str, offered_hex: str) -> bool:
    """Constant-time comparison (offered text is attacker-controlled)."""
    return hmac.compare_digest(
        expected_hex.encode(), offered_hex.lower().encode("ascii", "replace")
    )


def signed_metadata(
    api_key: str, secret: str, method: str, request: Message | None, timestamp_ms: int
) -> Metadata:
    body = signed_body(method, request)
    return (
        (API_KEY_HEADER, api_key),
        (TIMESTAMP_HEADER, str(timestamp_ms)),
        (SIGNATURE_HEADER, signature(secret, timestamp_ms, method, body)),
    )
