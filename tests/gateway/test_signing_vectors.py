"""The test vectors published in the manual, recomputed with the gateway's code.

A client written in another language is checked against docs/api/keys-and-signing.md;
this keeps the page true: every body, signed text and signature in its JSON blocks must
be what `gateway/signing.py` makes of the request given there.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from google.protobuf import json_format
from google.protobuf.message import Message

from gateway.signing import (
    Ed25519Signer,
    ed25519_matches,
    ed25519_signature,
    signature,
    signed_body,
    signed_metadata,
    signed_text,
)
from protos.oms.v1 import gateway_pb2
from tests.service_process import ROOT

PAGE = ROOT / "docs" / "api" / "keys-and-signing.md"


def published_blocks() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The HMAC vectors and the Ed25519 vectors, in the page's order."""
    hmac_block, ed25519_block = re.findall(r"```json\n(.*?)```", PAGE.read_text(), re.DOTALL)
    return json.loads(hmac_block), json.loads(ed25519_block)


def published_vectors() -> list[dict[str, Any]]:
    return published_blocks()[0]


def _request(vector: dict[str, Any]) -> Message | None:
    if vector["request_type"] is None:
        return None
    message_class = getattr(gateway_pb2, vector["request_type"].removeprefix("oms.v1."))
    message: Message = json_format.ParseDict(vector["request_json"], message_class())
    return message


def test_every_published_ed25519_vector_is_what_the_gateway_computes_and_accepts() -> None:
    hmac_vectors, vectors = published_blocks()
    assert {vector["method"] for vector in vectors} == {
        "/oms.v1.OrderGateway/PlaceOrder",
        "/oms.v1.OrderGateway/Trade",
    }
    for vector in vectors:
        method, timestamp_ms = vector["method"], vector["timestamp_ms"]
        key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(vector["private_key_seed_hex"]))
        public_key = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        assert public_key.hex() == vector["public_key_hex"]
        body = signed_body(method, _request(vector))
        assert body.hex() == vector["body_hex"], method
        text = signed_text(timestamp_ms, method, body)
        assert text.hex() == vector["signed_text_hex"], method
        # The same request and time as an HMAC vector: the same bytes signed.
        twin = next(v for v in hmac_vectors if v["timestamp_ms"] == timestamp_ms)
        assert twin["signed_text_hex"] == vector["signed_text_hex"]
        assert ed25519_signature(key, timestamp_ms, method, body) == vector["signature_hex"]
        assert ed25519_matches(public_key, text, vector["signature_hex"])
        assert not ed25519_matches(public_key, text + b"x", vector["signature_hex"])
        metadata = dict(
            signed_metadata(
                vector["api_key"], Ed25519Signer(key), method, _request(vector), timestamp_ms
            )
        )
        assert metadata["x-oms-signature"] == vector["signature_hex"], method


def test_the_rfc_8032_key_is_the_one_the_page_names() -> None:
    # RFC 8032, section 7.1, TEST 1: the secret key and its public key.
    (first, *_) = published_blocks()[1]
    assert first["private_key_seed_hex"] == (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
    )
    assert first["public_key_hex"] == (
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    )


def test_every_published_vector_is_what_the_gateway_computes() -> None:
    vectors = published_vectors()
    assert {vector["method"].rsplit("/", 1)[1] for vector in vectors} >= {"PlaceOrder", "Trade"}
    for vector in vectors:
        method, timestamp_ms = vector["method"], vector["timestamp_ms"]
        request = None
        if vector["request_type"] is not None:
            message_class = getattr(gateway_pb2, vector["request_type"].removeprefix("oms.v1."))
            request = json_format.ParseDict(vector["request_json"], message_class())
        body = signed_body(method, request)
        assert body.hex() == vector["body_hex"], method
        text = f"{timestamp_ms}\n{method}\n".encode() + body
        assert text.hex() == vector["signed_text_hex"], method
        expected = signature(vector["secret"], timestamp_ms, method, body)
        assert expected == vector["signature_hex"], method
        metadata = dict(
            signed_metadata(vector["api_key"], vector["secret"], method, request, timestamp_ms)
        )
        assert metadata["x-oms-signature"] == vector["signature_hex"], method
