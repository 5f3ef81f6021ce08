"""A gRPC channel to etcd and the stubs of etcd's services on it, generated from etcd's
own protos (`protos/etcd/`, stripped of Go options by `protos/etcd/strip_options.py`).

This is the whole of the etcd client library the mesh uses: a channel, its stubs, and
`prefix_end`. What is done with them (transactions, leases, watches, errors) is in
`etcd_session`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import grpc

from protos.etcd.etcdserverpb import rpc_pb2_grpc
from services.coordination.etcd_endpoints import EndpointError, uses_tls
from services.transport.certificates import Identity
from services.transport.tls import mesh_transport

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # A channel of its own per session: a broken connection of one session (a member
    # killed) is not shared with another that would otherwise reuse the subchannel.
    ("grpc.use_local_subchannel_pool", 1),
)


@dataclass(frozen=True, slots=True)
class EtcdCredentials:
    """How the mesh reaches etcd: plaintext, or TLS checked by `authority_pem`,
    presenting a client certificate (mutual TLS; etcd names the caller by its common
    name when its auth is on)."""

    authority_pem: bytes | None = None  # None: plaintext
    certificate_pem: bytes | None = None
    key_pem: bytes | None = None

    @property
    def tls(self) -> bool:
        return self.authority_pem is not None

    def _channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.authority_pem,
            private_key=self.key_pem,
            certificate_chain=self.certificate_pem,
        )

    def aio_channel(self, target: str) -> grpc.aio.Channel:
        if not self.tls:
            return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(target, self._channel_credentials(), options=CHANNEL_OPTIONS)

    def blocking_channel(self, target: str) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        return grpc.secure_channel(target, self._channel_credentials(), options=CHANNEL_OPTIONS)


PLAINTEXT = EtcdCredentials()


def credentials_of(authority_pem: bytes, identity: Identity) -> EtcdCredentials:
    return EtcdCredentials(authority_pem, identity.certificate_pem, identity.key_pem)


def etcd_credentials(endpoints: Sequence[str]) -> EtcdCredentials:
    """What this process shows etcd at `endpoints`: nothing when they are plaintext;
    for `https://` ones, the mesh's authority (etcd's certificate is checked by it) and
    this process's own mesh certificate (`OMS_TLS_CA`, `OMS_TLS_CERT`, `OMS_TLS_KEY`,
    or what a tool adopted from `mesh.json`), whose common name etcd takes as the user."""
    if not uses_tls(endpoints):
        return PLAINTEXT
    transport = mesh_transport()
    if transport.authority_pem is None or transport.identity is None:
        raise EndpointError(
            f"etcd endpoints {','.join(endpoints)} are https:// but this process has no "
            "certificate to show: set OMS_TLS_CA, OMS_TLS_CERT and OMS_TLS_KEY (OMS_TLS=on)"
        )
    return credentials_of(transport.authority_pem, transport.identity)


@dataclass(slots=True)
class EtcdChannel:
    """One gRPC channel to one etcd target and the stubs of etcd's services on it."""

    target: str
    channel: grpc.aio.Channel
    kv: rpc_pb2_grpc.KVAsyncStub = field(init=False)
    lease: rpc_pb2_grpc.LeaseAsyncStub = field(init=False)
    watch: rpc_pb2_grpc.WatchAsyncStub = field(init=False)
    maintenance: rpc_pb2_grpc.MaintenanceAsyncStub = field(init=False)
    cluster: rpc_pb2_grpc.ClusterAsyncStub = field(init=False)
    auth: rpc_pb2_grpc.AuthAsyncStub = field(init=False)

    def __post_init__(self) -> None:
        # The stubs' overloads pick the async types for a grpc.aio channel; grpc itself
        # is untyped here, so they are named (the async types exist in the stubs only).
        self.kv = cast("rpc_pb2_grpc.KVAsyncStub", rpc_pb2_grpc.KVStub(self.channel))
        self.lease = cast("rpc_pb2_grpc.LeaseAsyncStub", rpc_pb2_grpc.LeaseStub(self.channel))
        self.watch = cast("rpc_pb2_grpc.WatchAsyncStub", rpc_pb2_grpc.WatchStub(self.channel))
        self.maintenance = cast(
            "rpc_pb2_grpc.MaintenanceAsyncStub", rpc_pb2_grpc.MaintenanceStub(self.channel)
        )
        self.cluster = cast("rpc_pb2_grpc.ClusterAsyncStub", rpc_pb2_grpc.ClusterStub(self.channel))
        self.auth = cast("rpc_pb2_grpc.AuthAsyncStub", rpc_pb2_grpc.AuthStub(self.channel))

    @classmethod
    def open(cls, target: str, credentials: EtcdCredentials) -> EtcdChannel:
        return cls(target, credentials.aio_channel(target))

    @property
    def connected(self) -> bool:
        return bool(self.channel.get_state() == grpc.ChannelConnectivity.READY)

    def state(self) -> str:
        return str(self.channel.get_state().name)

    async def close(self) -> None:
        await self.channel.close()


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range holding every key that starts with `prefix` (etcd's
    rule: the prefix with its last byte below 0xff incremented, what follows it
    dropped; `b"\\0"`, every key, when there is no such byte)."""
    for index in range(len(prefix) - 1, -1, -1):
        if prefix[index] < 0xFF:
            return prefix[:index] + bytes((prefix[index] + 1,))
    return b"\0"
