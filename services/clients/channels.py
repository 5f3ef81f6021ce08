"""gRPC channels between mesh services, and the servers they reach: one place for options.

A restarted peer on the same address is found again within ~0.3 s instead of
gRPC's default reconnect backoff (1 s, growing to 2 min), and every channel gets
its own connection rather than a process-wide one still backing off.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import cast

import grpc

from services.clients.in_process import channel_for
from services.coordination.addresses import AddressSource
from services.coordination.errors import CoordinationUnavailable
from services.transport.tls import client_transport, mesh_transport

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)

# gRPC servers set SO_REUSEPORT by default: a second server started on a port that is
# already served binds without an error, and the kernel then splits connections
# between the two (a shard and a matcher answering on one address). Off, the second
# bind fails and the service says so at start.
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)


def mesh_channel(address: str) -> grpc.aio.Channel:
    """A channel to a mesh service, mutual TLS unless the mesh is plaintext
    (`services/transport/tls.py`); to a server of this very process (a co-located
    shard), its in-process channel (`services/clients/in_process.py`)."""
    local = channel_for(address)
    if local is not None:
        return cast(grpc.aio.Channel, local)  # the calls the mesh makes, without gRPC
    return mesh_transport().channel(address, CHANNEL_OPTIONS)


# The services clients reach on the public port (its certificate, no client certificate).
PUBLIC_SERVICES = frozenset({"gateway", "marketdata"})


def service_channel(service: str, address: str) -> grpc.aio.Channel:
    """A channel to one of the mesh's services by its name: the public port's for a
    public service, the mesh's otherwise."""
    return (gateway_channel if service in PUBLIC_SERVICES else mesh_channel)(address)


def gateway_channel(address: str) -> grpc.aio.Channel:
    """A client's channel to the gateway's public port: TLS checked by the client's
    authority and the host name, unless plaintext."""
    return client_transport().channel(address, CHANNEL_OPTIONS)


@contextlib.asynccontextmanager
async def group_channel(source: AddressSource) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to where `source` says the group is now (its leader, when replicated).

    Callers open one per connection attempt inside their retry loops: a failover
    breaks their calls (the old leader is gone or refuses), and the next attempt
    resolves the new leader. No leader known yet is a `ConnectionError` like any
    unreachable peer, so the loops retry it the same way.
    """
    try:
        address = await source.resolve()
    except CoordinationUnavailable as error:
        raise ConnectionError(f"{source.describe()}: {error}") from error
    async with mesh_channel(address) as channel:
        yield channel
