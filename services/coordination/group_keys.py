"""The keys of one replicated group (a shard, a matcher group) in etcd.

<prefix>leader                          the leader key (its lease; value: the leader's address)
<prefix>log/<first position, 20 digits> the group's log records (services/runtime/etcd_log.py)
<prefix>chunk/<first position>/<index>  pieces of records too big for one request
<prefix>replicas/<address>              each live replica (its lease; value: what it holds)
"""

from __future__ import annotations

from dataclasses import dataclass

from services.coordination.etcd_session import prefix_end


@dataclass(frozen=True, slots=True)
class GroupKeys:
    prefix: bytes

    @classmethod
    def of(cls, kind: str, name: str) -> GroupKeys:
        """The keys of one state machine: kind "shard" or "matcher", name its id."""
        return cls(f"/oms/v1/{kind}/{name}/".encode())

    @property
    def leader(self) -> bytes:
        return self.prefix + b"leader"

    @property
    def records(self) -> bytes:
        return self.prefix + b"log/"

    @property
    def records_end(self) -> bytes:
        return prefix_end(self.records)

    def record(self, first_position: int) -> bytes:
        return self.records + b"%020d" % first_position

    @property
    def chunks(self) -> bytes:
        return self.prefix + b"chunk/"

    def chunk_prefix(self, first_position: int) -> bytes:
        return self.chunks + b"%020d/" % first_position

    def chunk(self, first_position: int, index: int) -> bytes:
        return self.chunk_prefix(first_position) + b"%04d" % index

    @property
    def replicas(self) -> bytes:
        return self.prefix + b"replicas/"

    def position_of(self, record_key: bytes) -> int:
        return int(record_key[len(self.records) :])
