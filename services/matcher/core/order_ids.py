"""Order ids are the OMS's deterministic names: "<oms_shard>:<user_id>:<user_seq>".

Exactly one spelling is valid for each (shard, user, sequence), so two spellings
of one order can never dodge deduplication: decimal numbers without sign or
leading zeros, a user id equal to the order's (positive) `user_id`, a positive
sequence that fits in uint64. Shard names use letters, digits, '.', '_' and '-'.
"""

from __future__ import annotations

import re

MAX_ORDER_ID_LENGTH = 128
_SHARD_NAME = re.compile(r"[A-Za-z0-9._-]+")
UINT64_MAX = (1 << 64) - 1
# A bounded memo of shard names already checked against `_SHARD_NAME`, each held by one
# string object: it changes nothing but speed (no regex per order, one hash per name).
_SHARD_NAMES: dict[str, str] = {}
_MAX_SHARD_NAMES = 4096


def parse_order_id(order_id: str, user_id: int) -> tuple[str, int] | None:
    """(oms_shard, user_seq) of a well-formed id owned by `user_id`, else None."""
    if len(order_id) > MAX_ORDER_ID_LENGTH or not order_id.isascii():
        return None
    parts = order_id.split(":")
    if len(parts) != 3:
        return None
    oms_shard, user_text, sequence_text = parts
    if user_id <= 0:
        return None
    known = _SHARD_NAMES.get(oms_shard)
    if known is None:
        if _SHARD_NAME.fullmatch(oms_shard) is None:
            return None
        if len(_SHARD_NAMES) < _MAX_SHARD_NAMES:
            _SHARD_NAMES[oms_shard] = oms_shard
        known = oms_shard
    if user_text != str(user_id):
        return None
    if not sequence_text.isdigit() or sequence_text[0] == "0":
        return None
    user_seq = int(sequence_text)
    if user_seq > UINT64_MAX:
        return None
    return known, user_seq


def format_order_id(oms_shard: str, user_id: int, user_seq: int) -> str:
    return f"{oms_shard}:{user_id}:{user_seq}"
