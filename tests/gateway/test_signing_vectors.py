"""The test vectors published in gateway/SIGNING.md, recomputed with the gateway's code.

A client written in another language is checked against that page; this keeps the page
true: every body, signed text and signature in its JSON block must be what
`gateway/signing.py` makes of the request given there.
"""

from __future__ import annotations

import json
import re
from typing import Any

from google.protobuf import json_format

from gateway.signing import signature, signed_body, signed_metadata
from protos.oms.v1 import gateway_pb2
from tests.service_process import ROOT

PAGE = ROOT / "gateway" / "SIGNING.md"


def published_vectors() -> list[dict[str, Any]]:
    (block,) = re.findall(r"```json\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    vectors: list[dict[str, Any]] = json.loads(block)
    return vectors


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
