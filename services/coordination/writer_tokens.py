"""Fencing tokens of leader-only roles (a shard's bridge, its reconciler), checked by the
services they write to.

The holder of a role's etcd key (`services/serving/leader_only.py`) sends its token,
`<role>/<shard>/<term>` with the term the key's create revision, in the
`x-oms-writer` metadata of every call that writes (the matcher's and the shard's
`Execute` streams, the shard's `PublishMarks`). The receiver (`WriterFences`) admits
a call only for the term etcd names as the role's holder when it opens, remembers the
newest term it admitted per role, and refuses the next batch of any call of an older
term. So an instance that lost
its lease without knowing it yet (paused, partitioned) cannot act once its successor
has reached the receiver; before that, what it repeats is what the receivers already
drop as duplicates (order ids, event sequences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import GroupKeys

WRITER_METADATA_KEY = "x-oms-writer"
ETCD_TIMEOUT_S = 1.0


class WriterTokenError(ValueError):
    """The `x-oms-writer` metadata is not `<role>/<shard>/<term>`."""


@dataclass(frozen=True, slots=True)
class WriterToken:
    role: str
    shard_id: str
    term: int

    def header(self) -> tuple[str, str]:
        return WRITER_METADATA_KEY, f"{self.role}/{self.shard_id}/{self.term}"

    @classmethod
    def parse(cls, value: str) -> WriterToken:
        role, _, rest = value.partition("/")
        shard_id, _, term = rest.rpartition("/")
        if not role or not shard_id or not term.isdigit() or int(term) <= 0:
            raise WriterTokenError(f"{WRITER_METADATA_KEY} is <role>/<shard>/<term>, not {value!r}")
        return cls(role, shard_id, int(term))

    @classmethod
    def of_call(cls, metadata: Sequence[tuple[str, str | bytes]] | None) -> WriterToken | None:
        """The token a call carries, if any (WriterTokenError if malformed)."""
        for key, value in metadata or ():
            if key == WRITER_METADATA_KEY:
                return cls.parse(value.decode() if isinstance(value, bytes) else value)
        return None


class WriterCredential:
    """The sender's side: the token of the term this instance holds now, if any."""

    def __init__(self) -> None:
        self.token: WriterToken | None = None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return () if self.token is None else (self.token.header(),)


class WriterFenced(Exception):
    """A call's token is not (or no longer) the role's current term."""


class WriterFences:
    """The receiver's side: each call's term checked with etcd when it opens, and the
    newest term admitted per (role, shard), which every later batch is checked against.

    Without etcd endpoints (a mesh without leases sends no tokens) a token is taken as
    its role's holder, which still fences out every older one.
    """

    def __init__(self, etcd_endpoints: Sequence[str], mesh_id: str) -> None:
        self.etcd_endpoints = tuple(etcd_endpoints)
        self.mesh_id = mesh_id
        self._newest: dict[tuple[str, str], int] = {}
        self._session: EtcdSession | None = None
        self.admitted = 0
        self.refused = 0

    def newest(self, role: str, shard_id: str) -> int:
        return self._newest.get((role, shard_id), 0)

    async def admit(self, token: WriterToken) -> None:
        """Accept a new call of `token` if etcd names its term as the role's holder now
        and no newer term was admitted; WriterFenced otherwise; CoordinationUnavailable
        if etcd cannot say. (Once per call, so one etcd read per stream.)"""
        self.check(token)
        current = await self._current_term(token)
        # Another call may have been admitted during the read: only ever raise the mark.
        newest = self._raise_newest(token, current)
        if current != token.term or token.term < newest:
            self.refused += 1
            raise WriterFenced(
                f"{token.role} of {token.shard_id}: term {token.term} is not the holder's "
                f"({current or 'nobody'} in etcd, {newest} admitted)"
            )
        self.admitted += 1

    def _raise_newest(self, token: WriterToken, term: int) -> int:
        key = (token.role, token.shard_id)
        newest = max(self._newest.get(key, 0), term)
        if newest:
            self._newest[key] = newest
        return newest

    def check(self, token: WriterToken) -> None:
        """Before each batch of an admitted call: WriterFenced once a newer term came."""
        newest = self.newest(token.role, token.shard_id)
        if token.term < newest:
            self.refused += 1
            raise WriterFenced(
                f"{token.role} of {token.shard_id}: term {token.term} is over ({newest} now)"
            )

    async def _current_term(self, token: WriterToken) -> int:
        if not self.etcd_endpoints:
            return token.term
        if self._session is None:
            # Short: a call waits for this before its stream's headers (a ShardLink
            # gives a stream's opening 3 s).
            self._session = EtcdSession(self.etcd_endpoints, timeout_s=ETCD_TIMEOUT_S)
        leader = GroupKeys.of(self.mesh_id, token.role, token.shard_id).leader
        entry = await self._session.get(leader)  # CoordinationUnavailable: cannot say
        return 0 if entry is None else entry.create_revision

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
