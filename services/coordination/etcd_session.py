"""The one module that speaks etcd: keys, fenced transactions, leases, watches, status.

It calls etcd's own gRPC services through stubs generated from etcd's protos
(`etcd_channel`); there is no third-party etcd client.

Everything else in the mesh uses `EtcdSession` and sees only our own errors
(`services.coordination.errors`): `CoordinationUnavailable` when etcd cannot
answer (retry), `RevisionCompacted` when a watch asks for history etcd no longer
keeps (read the current state instead). A transaction whose compare fails is not
an error: it returns False, and the caller says what that means (`LogFencedError`
for an append whose leader key changed).

Endpoints are read by `etcd_endpoints` (host names, IPv4 and IPv6 addresses, URLs).
Several addresses share one gRPC channel whose `round_robin` policy moves on from a
member that is down, so a member's loss is invisible to callers; host names get a
channel each, and a call that fails sends the next ones to another endpoint
(the failed call itself is not sent again: a transaction may have committed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from protos.etcd.etcdserverpb import rpc_pb2 as rpc
from protos.etcd.etcdserverpb import rpc_pb2_grpc
from protos.etcd.mvccpb import kv_pb2
from services.coordination.errors import (
    CoordinationDenied,
    CoordinationError,
    CoordinationUnavailable,
    RevisionCompacted,
)
from services.coordination.etcd_channel import (
    EtcdChannel,
    EtcdCredentials,
    etcd_credentials,
    prefix_end,
)
from services.coordination.etcd_endpoints import ChannelRing, channel_targets, parse_endpoints

__all__ = [
    "BlockingLeaseRenewer",
    "Entry",
    "EtcdMember",
    "EtcdSession",
    "Guard",
    "StorageStatus",
    "WatchEvent",
    "prefix_end",
]

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 5.0
# What etcd answers when the caller may not do what it asked (auth on: a certificate
# whose name is no user, or a user without the role for the key); retrying will not help.
_DENIED_CODES = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})
_DENIED_PHRASES = ("user name not found", "authentication failed", "root user does not")


@dataclass(frozen=True, slots=True)
class Entry:
    """One key as etcd holds it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class StorageStatus:
    """What the answering member's backend holds: the file's size, the part of it in
    use (the rest is free pages a compaction released, reused before the file grows),
    and the store's revision."""

    db_size_bytes: int
    db_size_in_use_bytes: int
    revision: int


@dataclass(frozen=True, slots=True)
class EtcdMember:
    """One member of the etcd cluster as it lists itself."""

    member_id: int
    name: str
    client_urls: tuple[str, ...]
    peer_urls: tuple[str, ...]
    is_learner: bool


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: str  # "put" or "delete"
    entry: Entry


@dataclass(frozen=True, slots=True)
class Guard:
    """A transaction's compare: `key` exists and was created at `create_revision`
    (the leader key of one term), or with `create_revision` 0: `key` is absent."""

    key: bytes
    create_revision: int


def _entry(kv: kv_pb2.KeyValue) -> Entry:
    return Entry(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)


def _unavailable(error: BaseException) -> CoordinationUnavailable:
    return CoordinationUnavailable(f"etcd: {type(error).__name__}: {error}")


def _refused(error: grpc.aio.AioRpcError | grpc.RpcError) -> CoordinationError:
    """Our error for a failed call: denied (do not retry) or unavailable (retry)."""
    if isinstance(error, grpc.aio.AioRpcError | grpc.Call):
        code, details = error.code(), str(error.details() or "")
        # etcd says "user name not found" (FAILED_PRECONDITION) to a certificate whose
        # name is no user, on the calls that check the user before any key.
        if code in _DENIED_CODES or any(phrase in details for phrase in _DENIED_PHRASES):
            return CoordinationDenied(f"etcd refused the call: {details}")
    return _unavailable(error)


class EtcdSession:
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        credentials: EtcdCredentials | None = None,
    ) -> None:
        """`credentials` default to what the endpoints ask for: this process's mesh
        certificate for `https://` ones, nothing for plaintext (`etcd_credentials`)."""
        self.endpoints = tuple(endpoints)
        self.timeout_s = timeout_s
        if credentials is None:
            credentials = etcd_credentials(self.endpoints)
        self.credentials = credentials
        self._ring: ChannelRing[EtcdChannel] = ChannelRing(
            channel_targets(parse_endpoints(self.endpoints)),
            lambda target: EtcdChannel.open(target, credentials),
            lambda channel: channel.connected,
        )
        self._chosen = False  # whether the first call looked for an endpoint that answers
        self.revision = 0  # the newest store revision any answer carried

    async def __aenter__(self) -> EtcdSession:
        await self._ready()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._ring.opened():
            with contextlib.suppress(Exception):
                await channel.close()

    @contextlib.contextmanager
    def _translated(self, channel: EtcdChannel) -> Iterator[None]:
        """Our errors for gRPC's; a call that found etcd unavailable sends the next ones
        to another endpoint (when there are several channels)."""
        try:
            yield
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as error:
            translated = (
                _refused(error) if isinstance(error, grpc.aio.AioRpcError) else _unavailable(error)
            )
            if isinstance(translated, CoordinationUnavailable):
                self._ring.failed(channel)
            raise translated from error

    async def _ready(self) -> EtcdChannel:
        """The channel calls go to now (connected, or connecting on the call)."""
        if not self._chosen:
            self._chosen = True
            await self._choose()
        channel = self._ring.current
        if not channel.connected:
            # Not connected now (down, or never tried): another that is takes the call.
            ready = [other for other in self._ring.opened() if other.connected]
            if ready:
                self._ring.prefer(ready[0])
                channel = ready[0]
        return channel

    def endpoint_states(self) -> dict[str, str]:
        """Each channel's target and what gRPC says of its connection (READY, IDLE,
        CONNECTING, TRANSIENT_FAILURE); the first is the one calls go to now."""
        order = [
            self._ring.index,
            *(i for i in range(len(self._ring.targets)) if i != self._ring.index),
        ]
        channels = self._ring.every()
        return {self._ring.targets[index]: channels[index].state() for index in order}

    async def _choose(self) -> None:
        """With several channels, start the first call at one that connects (the first
        endpoint listed may be down), waiting at most the session's timeout."""
        if len(self._ring.targets) == 1:
            return
        channels = self._ring.every()
        waits = {
            asyncio.ensure_future(channel.channel.channel_ready()): channel for channel in channels
        }
        try:
            done, _ = await asyncio.wait(
                waits, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        answered = [waits[wait] for wait in done if not wait.cancelled() and not wait.exception()]
        if answered:
            self._ring.prefer(answered[0])

    def _seen(self, header: rpc.ResponseHeader) -> None:
        self.revision = max(self.revision, header.revision)

    async def call(self, operation: Callable[[EtcdChannel], Awaitable[T]]) -> T:
        """One call of the adapter's own (`etcd_access`) on the channel calls go to now,
        its errors ours."""
        channel = await self._ready()
        with self._translated(channel):
            return await operation(channel)

    # --- reads ---------------------------------------------------------------------------

    async def get(self, key: bytes) -> Entry | None:
        entries = await self.range(key)
        return entries[0] if entries else None

    async def range(
        self,
        start: bytes,
        end: bytes = b"",
        *,
        limit: int = 0,
        descending: bool = False,
        keys_only: bool = False,
    ) -> list[Entry]:
        """Keys in [start, end) in key order (`end` empty: `start` alone)."""
        channel = await self._ready()
        request = rpc.RangeRequest(key=start, range_end=end, limit=limit, keys_only=keys_only)
        if descending:
            request.sort_order = rpc.RangeRequest.DESCEND
            request.sort_target = rpc.RangeRequest.KEY
        with self._translated(channel):
            response = await channel.kv.Range(request, timeout=self.timeout_s)
        self._seen(response.header)
        return [_entry(kv) for kv in response.kvs]

    # --- writes ----------------------------------------------------------------------------

    async def _txn(
        self, request: rpc.TxnRequest, timeout_s: float | None = None
    ) -> rpc.TxnResponse:
        channel = await self._ready()
        with self._translated(channel):
            response: rpc.TxnResponse = await channel.kv.Txn(
                request, timeout=timeout_s or self.timeout_s
            )
        self._seen(response.header)
        return response

    async def transaction(
        self,
        guards: Sequence[Guard],
        *,
        puts: Sequence[tuple[bytes, bytes]] = (),
        deletes: Sequence[tuple[bytes, bytes]] = (),
        lease: int = 0,
        timeout_s: float | None = None,
    ) -> bool:
        """Put and delete (ranges [start, end)) only if every guard holds; whether they did.

        `timeout_s` (default: the session's) bounds this one request: a caller that can
        retry safely gives up sooner on a request that went to a member that died."""
        compares = [
            rpc.Compare(
                key=guard.key,
                result=rpc.Compare.EQUAL,
                target=rpc.Compare.CREATE,
                create_revision=guard.create_revision,
            )
            for guard in guards
        ]
        operations = [
            rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
            for key, value in puts
        ]
        operations += [
            rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=start, range_end=end))
            for start, end in deletes
        ]
        response = await self._txn(rpc.TxnRequest(compare=compares, success=operations), timeout_s)
        return bool(response.succeeded)

    async def swap(self, key: bytes, value: bytes, *, mod_revision: int) -> int | None:
        """Put `key` only if it was last written at `mod_revision` (0: absent); the
        revision of the write, or None if `key` changed in between."""
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    key=key,
                    result=rpc.Compare.EQUAL,
                    target=rpc.Compare.MOD,
                    mod_revision=mod_revision,
                )
            ],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))],
        )
        response = await self._txn(request)
        return int(response.header.revision) if response.succeeded else None

    async def create(self, key: bytes, value: bytes, *, lease: int) -> tuple[bool, Entry | None]:
        """Put `key` if it does not exist; (created, the key as it is now)."""
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, create_revision=0
                )
            ],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease)),
                rpc.RequestOp(request_range=rpc.RangeRequest(key=key)),
            ],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
        )
        response = await self._txn(request)
        ranges = [r.response_range for r in response.responses if r.HasField("response_range")]
        kvs = ranges[-1].kvs if ranges else []
        return bool(response.succeeded), (_entry(kvs[0]) if kvs else None)

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> None:
        await self.transaction((), puts=((key, value),), lease=lease)

    async def delete(self, key: bytes) -> None:
        await self.transaction((), deletes=((key, b""),))

    async def compact(self, revision: int) -> None:
        """Drop the history before `revision` (keys as they are now stay)."""
        channel = await self._ready()
        with self._translated(channel):
            await channel.kv.Compact(
                rpc.CompactionRequest(revision=revision), timeout=self.timeout_s
            )

    # --- the cluster -----------------------------------------------------------------------

    async def storage(self) -> StorageStatus:
        channel = await self._ready()
        with self._translated(channel):
            response = await channel.maintenance.Status(rpc.StatusRequest(), timeout=self.timeout_s)
        self._seen(response.header)
        return StorageStatus(response.dbSize, response.dbSizeInUse, response.header.revision)

    async def members(self) -> list[EtcdMember]:
        """The cluster's members as the answering one knows them, by name."""
        channel = await self._ready()
        with self._translated(channel):
            response = await channel.cluster.MemberList(
                rpc.MemberListRequest(), timeout=self.timeout_s
            )
        self._seen(response.header)
        found = [
            EtcdMember(
                member.ID,
                member.name,
                tuple(member.clientURLs),
                tuple(member.peerURLs),
                member.isLearner,
            )
            for member in response.members
        ]
        return sorted(found, key=lambda member: member.name)

    # --- leases ----------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        channel = await self._ready()
        with self._translated(channel):
            response = await channel.lease.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=ttl_s), timeout=self.timeout_s
            )
        if response.error:
            raise CoordinationUnavailable(f"etcd granted no lease: {response.error}")
        self._seen(response.header)
        return int(response.ID)

    async def keep_alive(self, lease_id: int) -> int:
        """Renew the lease; its remaining TTL in seconds (0 or less: it is gone)."""
        channel = await self._ready()
        call = channel.lease.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout_s
        )
        try:
            with self._translated(channel):
                reply = await call.read()
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            raise CoordinationUnavailable("etcd ended the keep-alive stream without an answer")
        assert isinstance(reply, rpc.LeaseKeepAliveResponse)
        return int(reply.TTL)

    async def revoke_lease(self, lease_id: int) -> None:
        """End the lease and delete its keys (a lease already gone is not an error)."""
        channel = await self._ready()
        try:
            with self._translated(channel):
                await channel.lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout_s
                )
        except CoordinationUnavailable as error:
            cause = error.__cause__
            if (
                isinstance(cause, grpc.aio.AioRpcError)
                and cause.code() == grpc.StatusCode.NOT_FOUND
            ):
                return
            raise

    # --- watches ---------------------------------------------------------------------------

    async def watch(
        self, start: bytes, end: bytes, *, from_revision: int
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes to keys in [start, end) from `from_revision` on, in revision order.

        Raises `RevisionCompacted` when that revision's history is gone (when the watch
        is created, or later if it falls behind a compaction), `CoordinationUnavailable`
        when the watch breaks, `CoordinationDenied` when etcd refuses it. One stream per
        watch: the few watches a process holds do not need etcd's multiplexing.
        """
        channel = await self._ready()
        call = channel.watch.Watch()
        try:
            create = rpc.WatchCreateRequest(key=start, range_end=end, start_revision=from_revision)
            with self._translated(channel):
                await call.write(rpc.WatchRequest(create_request=create))
                async with asyncio.timeout(self.timeout_s):
                    created = await call.read()
            response = self._watched(created)
            if not response.created:
                raise CoordinationUnavailable("etcd answered a watch request without creating it")
            while True:
                for event in response.events:
                    entry = _entry(event.kv)
                    self.revision = max(self.revision, entry.mod_revision)
                    kind = "delete" if event.type == kv_pb2.Event.DELETE else "put"
                    yield WatchEvent(kind, entry)
                with self._translated(channel):
                    answer = await call.read()
                response = self._watched(answer)
        finally:
            call.cancel()

    def _watched(self, answer: object) -> rpc.WatchResponse:
        """One answer of a watch stream, or the error it stands for."""
        if answer is grpc.aio.EOF:
            raise CoordinationUnavailable("etcd ended the watch stream")
        assert isinstance(answer, rpc.WatchResponse)
        if answer.compact_revision:
            # Never skipped: the caller reads the current state and watches on from it.
            raise RevisionCompacted(answer.compact_revision)
        if answer.canceled:
            reason = answer.cancel_reason or "no reason given"
            if "permission denied" in reason:
                raise CoordinationDenied(f"etcd refused the watch: {reason}")
            raise CoordinationUnavailable(f"etcd cancelled the watch: {reason}")
        return answer


class BlockingLeaseRenewer:
    """Renews one lease over a blocking gRPC channel of its own, for a thread of its own.

    A leader's event loop can be busy for longer than a lease's TTL under overload
    (large batches applied, egress encoded); a keep-alive that waits for that loop
    would let the lease lapse and depose a leader that is working. A thread with a
    blocking call (which releases the GIL while it waits) renews on time whatever
    the loop does; the appends stay fenced either way, so this only decides how
    soon a dead or stopped leader is replaced, never who may write.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float,
        credentials: EtcdCredentials | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        if credentials is None:
            credentials = etcd_credentials(endpoints)
        self._ring: ChannelRing[grpc.Channel] = ChannelRing(
            channel_targets(parse_endpoints(endpoints)),
            credentials.blocking_channel,
            lambda _channel: False,  # a blocking channel does not say; the next one is tried
        )

    def keep_alive(self, lease_id: int) -> int:
        """Renew the lease; its remaining TTL in seconds (0 or less: it is gone)."""
        channel = self._ring.current
        try:
            replies = rpc_pb2_grpc.LeaseStub(channel).LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout_s
            )
            for reply in replies:
                return int(reply.TTL)
        except grpc.RpcError as error:
            translated = _refused(error)
            if isinstance(translated, CoordinationUnavailable):
                self._ring.failed(channel)
            raise translated from error
        return 0

    def close(self) -> None:
        for channel in self._ring.opened():
            channel.close()
