"""The one module that speaks etcd (through aetcd): keys, fenced transactions, leases, watches.

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
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc

from services.coordination.errors import CoordinationUnavailable, RevisionCompacted
from services.coordination.etcd_endpoints import ChannelRing, channel_targets, parse_endpoints

DEFAULT_TIMEOUT_S = 5.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_CHANNEL_OPTIONS = {
    "grpc.lb_policy_name": "round_robin",
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
    "grpc.use_local_subchannel_pool": 1,
}


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
class WatchEvent:
    kind: str  # "put" or "delete"
    entry: Entry


@dataclass(frozen=True, slots=True)
class Guard:
    """A transaction's compare: `key` exists and was created at `create_revision`
    (the leader key of one term), or with `create_revision` 0: `key` is absent."""

    key: bytes
    create_revision: int


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range holding every key that starts with `prefix`."""
    return aetcd.utils.prefix_range_end(prefix)  # type: ignore[no-any-return]


def _host_and_port(target: str) -> tuple[str, int]:
    """aetcd formats its target as f"{host}:{port}": split ours at its last colon."""
    host, _, port = target.rpartition(":")
    return host, int(port)


def _entry(kv: rpc.KeyValue) -> Entry:
    return Entry(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)


def _unavailable(error: BaseException) -> CoordinationUnavailable:
    return CoordinationUnavailable(f"etcd: {type(error).__name__}: {error}")


def _open_client(target: str, timeout_s: float) -> aetcd.Client:
    host, port = _host_and_port(target)
    return aetcd.Client(host=host, port=port, timeout=timeout_s, options=dict(_CHANNEL_OPTIONS))


def _connected(client: aetcd.Client) -> bool:
    channel = client.channel
    return channel is not None and channel.get_state() == grpc.ChannelConnectivity.READY


class EtcdSession:
    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.endpoints = tuple(endpoints)
        self.timeout_s = timeout_s
        self._ring: ChannelRing[aetcd.Client] = ChannelRing(
            channel_targets(parse_endpoints(self.endpoints)),
            lambda target: _open_client(target, timeout_s),
            _connected,
        )
        self._chosen = False  # whether the first call looked for an endpoint that answers
        self.revision = 0  # the newest store revision any answer carried

    async def __aenter__(self) -> EtcdSession:
        await self._ready()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        for client in self._ring.opened():
            with contextlib.suppress(Exception):
                await client.close()

    @contextlib.contextmanager
    def _translated(self, client: aetcd.Client) -> Iterator[None]:
        """Our errors for the library's; a call that found etcd unavailable sends the
        next ones to another endpoint (when there are several channels)."""
        try:
            yield
        except aetcd.exceptions.RevisionCompactedError as error:
            raise RevisionCompacted(error.compacted_revision) from error
        except (aetcd.exceptions.ClientError, grpc.aio.AioRpcError, OSError) as error:
            self._ring.failed(client)
            raise _unavailable(error) from error

    async def _ready(self) -> aetcd.Client:
        """The client calls go to now, connected (its channel, not yet its socket)."""
        if not self._chosen:
            self._chosen = True
            await self._choose()
        client = self._ring.current
        with self._translated(client):
            await client.connect()
        if not _connected(client):
            # Not connected now (down, or never tried): another that is takes the call.
            ready = [other for other in self._ring.opened() if _connected(other)]
            if ready:
                self._ring.prefer(ready[0])
                client = ready[0]
        return client

    def endpoint_states(self) -> dict[str, str]:
        """Each channel's target and what gRPC says of its connection (READY, IDLE,
        CONNECTING, TRANSIENT_FAILURE); the first is the one calls go to now."""
        order = [
            self._ring.index,
            *(i for i in range(len(self._ring.targets)) if i != self._ring.index),
        ]
        clients = self._ring.every()
        states = {}
        for index in order:
            channel = clients[index].channel
            state = channel.get_state().name if channel is not None else "IDLE"
            states[self._ring.targets[index]] = state
        return states

    async def _choose(self) -> None:
        """With several channels, start the first call at one that connects (the first
        endpoint listed may be down), waiting at most the session's timeout."""
        if len(self._ring.targets) == 1:
            return
        clients = self._ring.every()
        for client in clients:
            with self._translated(client):
                await client.connect()
        waits = {
            asyncio.ensure_future(client.channel.channel_ready()): client for client in clients
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
        client = await self._ready()
        request = rpc.RangeRequest(key=start, range_end=end, limit=limit, keys_only=keys_only)
        if descending:
            request.sort_order = rpc.RangeRequest.DESCEND
            request.sort_target = rpc.RangeRequest.KEY
        with self._translated(client):
            response = await client.kvstub.Range(request, timeout=self.timeout_s)
        self._seen(response.header)
        return [_entry(kv) for kv in response.kvs]

    # --- writes ----------------------------------------------------------------------------

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
        client = await self._ready()
        compares = []
        for guard in guards:
            compare = rpc.Compare(
                key=guard.key,
                result=rpc.Compare.EQUAL,
                target=rpc.Compare.CREATE,
                create_revision=guard.create_revision,
            )
            compares.append(compare)
        operations = [
            rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))
            for key, value in puts
        ]
        operations += [
            rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=start, range_end=end))
            for start, end in deletes
        ]
        request = rpc.TxnRequest(compare=compares, success=operations)
        with self._translated(client):
            response = await client.kvstub.Txn(request, timeout=timeout_s or self.timeout_s)
        self._seen(response.header)
        return bool(response.succeeded)

    async def swap(self, key: bytes, value: bytes, *, mod_revision: int) -> int | None:
        """Put `key` only if it was last written at `mod_revision` (0: absent); the
        revision of the write, or None if `key` changed in between."""
        client = await self._ready()
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
        with self._translated(client):
            response = await client.kvstub.Txn(request, timeout=self.timeout_s)
        self._seen(response.header)
        return int(response.header.revision) if response.succeeded else None

    async def create(self, key: bytes, value: bytes, *, lease: int) -> tuple[bool, Entry | None]:
        """Put `key` if it does not exist; (created, the key as it is now)."""
        client = await self._ready()
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
        with self._translated(client):
            response = await client.kvstub.Txn(request, timeout=self.timeout_s)
        self._seen(response.header)
        ranges = [r.response_range for r in response.responses if r.HasField("response_range")]
        kvs = ranges[-1].kvs if ranges else []
        return bool(response.succeeded), (_entry(kvs[0]) if kvs else None)

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> None:
        await self.transaction((), puts=((key, value),), lease=lease)

    async def delete(self, key: bytes) -> None:
        await self.transaction((), deletes=((key, b""),))

    async def compact(self, revision: int) -> None:
        """Drop the history before `revision` (keys as they are now stay)."""
        client = await self._ready()
        with self._translated(client):
            await client.kvstub.Compact(
                rpc.CompactionRequest(revision=revision), timeout=self.timeout_s
            )

    async def storage(self) -> StorageStatus:
        client = await self._ready()
        with self._translated(client):
            response = await client.maintenancestub.Status(
                rpc.StatusRequest(), timeout=self.timeout_s
            )
        self._seen(response.header)
        return StorageStatus(response.dbSize, response.dbSizeInUse, response.header.revision)

    # --- leases ----------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        client = await self._ready()
        with self._translated(client):
            lease = await client.lease(ttl_s)
        return int(lease.id)

    async def keep_alive(self, lease_id: int) -> int:
        """Renew the lease; its remaining TTL in seconds (0 or less: it is gone)."""
        client = await self._ready()
        with self._translated(client):
            reply = await client.refresh_lease(lease_id)
        return int(reply.TTL) if reply is not None else 0

    async def revoke_lease(self, lease_id: int) -> None:
        client = await self._ready()
        with self._translated(client):
            await client.revoke_lease(lease_id)

    # --- watches ---------------------------------------------------------------------------

    async def watch(
        self, start: bytes, end: bytes, *, from_revision: int
    ) -> AsyncGenerator[WatchEvent, None]:
        """Changes to keys in [start, end) from `from_revision` on, in revision order.

        Raises `RevisionCompacted` when that revision's history is gone, and
        `CoordinationUnavailable` when the watch breaks.
        """
        client = await self._ready()
        with self._translated(client):
            watch = await client.watch(start, range_end=end, start_revision=from_revision)
        try:
            with self._translated(client):
                async for event in watch:
                    kv = event.kv
                    entry = Entry(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease)
                    self.revision = max(self.revision, kv.mod_revision)
                    yield WatchEvent("delete" if event.kind == "DELETE" else "put", entry)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(watch.cancel())


class BlockingLeaseRenewer:
    """Renews one lease over a blocking gRPC channel of its own, for a thread of its own.

    A leader's event loop can be busy for longer than a lease's TTL under overload
    (large batches applied, egress encoded); a keep-alive that waits for that loop
    would let the lease lapse and depose a leader that is working. A thread with a
    blocking call (which releases the GIL while it waits) renews on time whatever
    the loop does; the appends stay fenced either way, so this only decides how
    soon a dead or stopped leader is replaced, never who may write.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        options = list(_CHANNEL_OPTIONS.items())
        self._ring: ChannelRing[grpc.Channel] = ChannelRing(
            channel_targets(parse_endpoints(endpoints)),
            lambda target: grpc.insecure_channel(target, options=options),
            lambda _channel: False,  # a blocking channel does not say; the next one is tried
        )

    def keep_alive(self, lease_id: int) -> int:
        """Renew the lease; its remaining TTL in seconds (0 or less: it is gone)."""
        channel = self._ring.current
        try:
            replies = rpc.LeaseStub(channel).LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout_s
            )
            for reply in replies:
                return int(reply.TTL)
        except grpc.RpcError as error:
            self._ring.failed(channel)
            raise _unavailable(error) from error
        return 0

    def close(self) -> None:
        for channel in self._ring.opened():
            channel.close()
