"""Request signing, shared by the gateway and its clients: one place for the scheme.

A request carries three metadata entries (gateway.proto):
  x-oms-api-key:   the key id
  x-oms-timestamp: client wall time in ms
  x-oms-signature: hex HMAC-SHA256(secret, "<timestamp>\\n<full method>\\n" + body)
                   for an HMAC key; hex Ed25519 signature (64 bytes) of the same text
                   for an Ed25519 key
where body is the request message serialized deterministically, or empty for the
streaming calls (authenticated once, at open). The manual's page
`docs/api/keys-and-signing.md` has the exact bytes and test vectors for other
languages. Binding the method into the signed text stops a signature for one call
being replayed against another with the same bytes; binding the timestamp bounds
replays to the server's window.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
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
        "/oms.v1.MarketData/StreamOrderBook",
        "/oms.v1.MarketData/StreamTrades",
    }
)

Metadata = tuple[tuple[str, str], ...]


def signed_body(method: str, request: Message | None) -> bytes:
    """The bytes a request of `method` is signed over (after the method line)."""
    if method in STREAM_METHODS or request is None:
        return b""
    return request.SerializeToString(deterministic=True)


def signed_text(timestamp_ms: int, method: str, body: bytes) -> bytes:
    """The exact bytes every signature covers."""
    return f"{timestamp_ms}\n{method}\n".encode() + body


def signature(secret: str, timestamp_ms: int, method: str, body: bytes) -> str:
    """An HMAC key's signature, hex."""
    return hmac.digest(
        secret.encode(), signed_text(timestamp_ms, method, body), hashlib.sha256
    ).hex()


def ed25519_signature(
    private_key: Ed25519PrivateKey, timestamp_ms: int, method: str, body: bytes
) -> str:
    """An Ed25519 key's signature, hex (128 digits). Ed25519 is deterministic: the same
    key and text always give the same signature, so the manual's vectors
    (`docs/api/keys-and-signing.md`) are exact."""
    return private_key.sign(signed_text(timestamp_ms, method, body)).hex()


def ed25519_matches(public_key: bytes, text: bytes, offered_hex: str) -> bool:
    """Whether `offered_hex` is the key's signature of `text` (anything malformed: no)."""
    try:
        offered = bytes.fromhex(offered_hex)
        Ed25519PublicKey.from_public_bytes(public_key).verify(offered, text)
    except (ValueError, InvalidSignature):
        return False
    return True


def signature_matches(expected_hex: str, offered_hex: str) -> bool:
    """Constant-time comparison (offered text is attacker-controlled)."""
    return hmac.compare_digest(
        expected_hex.encode(), offered_hex.lower().encode("ascii", "replace")
    )


class Signer(Protocol):
    """What signs a client's requests: an HMAC secret or an Ed25519 private key."""

    def sign(self, timestamp_ms: int, method: str, body: bytes) -> str: ...


class HmacSigner:
    def __init__(self, secret: str) -> None:
        self.secret = secret

    def sign(self, timestamp_ms: int, method: str, body: bytes) -> str:
        return signature(self.secret, timestamp_ms, method, body)


class Ed25519Signer:
    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self.private_key = private_key

    def sign(self, timestamp_ms: int, method: str, body: bytes) -> str:
        return ed25519_signature(self.private_key, timestamp_ms, method, body)


def signed_metadata(
    api_key: str, signer: Signer | str, method: str, request: Message | None, timestamp_ms: int
) -> Metadata:
    """The three headers of a request; `signer` an HMAC secret (str) or a `Signer`."""
    body = signed_body(method, request)
    sign = HmacSigner(signer) if isinstance(signer, str) else signer
    return (
        (API_KEY_HEADER, api_key),
        (TIMESTAMP_HEADER, str(timestamp_ms)),
        (SIGNATURE_HEADER, sign.sign(timestamp_ms, method, body)),
    )
