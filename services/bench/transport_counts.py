"""What an order costs in messages and wake-ups, per process and per hop.

Every mesh process serves gRPC's channelz (`grpc.channelz.v1.Channelz`, from
gRPC's own `grpcio-channelz`), which counts the messages each of its
connections sent and received. A snapshot before and after a phase, from every
process, gives the messages of the phase per connection; a connection is named
by its two ends (the process that dialled and the one that listens: a client
socket's remote port is a listening port of the mesh, a server socket's remote
port is the local port of some process's client socket), so the report can say
"gateway → shard: 1.0 message per order, shard → gateway: 1.3".

Wake-ups are read from /proc: the voluntary context switches of every thread of
a process (a thread that blocks and is woken again), summed. Threads that ended
during the phase are not counted (gRPC's and the log writer's live as long as
the process).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_channelz.v1 import channelz_pb2, channelz_pb2_grpc

from services.transport.tls import client_transport, mesh_transport

CALL_TIMEOUT_S = 5.0
PAGE = 1_000
LOAD_GENERATOR = "load"
ETCD = "etcd"
OUTSIDE = "other"


@dataclass(frozen=True, slots=True)
class SocketCount:
    socket_id: int
    dialled: bool  # this process opened the connection (a client socket)
    local_port: int
    remote_port: int
    sent: int
    received: int


@dataclass
class TransportSnapshot:
    """Every process's sockets and voluntary context switches at one moment."""

    sockets: dict[str, list[SocketCount]] = field(default_factory=dict)
    switches: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PhaseTransport:
    """Messages and wake-ups over a phase: `links[(sender, receiver)]` counts the
    messages `sender` sent to `receiver`; `per_process` what each sent and received;
    `switches` each process's voluntary context switches."""

    links: Mapping[tuple[str, str], int]
    sent: Mapping[str, int]
    received: Mapping[str, int]
    switches: Mapping[str, int]


async def process_sockets(address: str, *, public: bool = False) -> list[SocketCount]:
    """Every socket one process's gRPC holds, server and client side (channelz);
    `public`: the address is the gateway's public port (a client's TLS, not the mesh's)."""
    transport = client_transport() if public else mesh_transport()
    async with transport.channel(address, ()) as channel:
        stub = channelz_pb2_grpc.ChannelzStub(channel)
        socket_ids: list[tuple[int, bool]] = []
        servers = await stub.GetServers(
            channelz_pb2.GetServersRequest(start_server_id=0), timeout=CALL_TIMEOUT_S
        )
        for server in servers.server:
            start = 0
            while True:
                page = await stub.GetServerSockets(
                    channelz_pb2.GetServerSocketsRequest(
                        server_id=server.ref.server_id, start_socket_id=start, max_results=PAGE
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
                socket_ids += [(ref.socket_id, False) for ref in page.socket_ref]
                if page.end or not page.socket_ref:
                    break
                start = page.socket_ref[-1].socket_id + 1
        start = 0
        while True:
            top = await stub.GetTopChannels(
                channelz_pb2.GetTopChannelsRequest(start_channel_id=start), timeout=CALL_TIMEOUT_S
            )
            for top_channel in top.channel:
                for ref in top_channel.subchannel_ref:
                    subchannel = await stub.GetSubchannel(
                        channelz_pb2.GetSubchannelRequest(subchannel_id=ref.subchannel_id),
                        timeout=CALL_TIMEOUT_S,
                    )
                    socket_ids += [(s.socket_id, True) for s in subchannel.subchannel.socket_ref]
            if top.end or not top.channel:
                break
            start = top.channel[-1].ref.channel_id + 1
        counts = []
        for socket_id, dialled in dict(socket_ids).items():
            with contextlib.suppress(grpc.aio.AioRpcError):  # closed meanwhile
                answer = await stub.GetSocket(
                    channelz_pb2.GetSocketRequest(socket_id=socket_id), timeout=CALL_TIMEOUT_S
                )
                socket = answer.socket
                counts.append(
                    SocketCount(
                        socket_id,
                        dialled,
                        socket.local.tcpip_address.port,
                        socket.remote.tcpip_address.port,
                        socket.data.messages_sent,
                        socket.data.messages_received,
                    )
                )
        return counts


def voluntary_switches(pid: int) -> int:
    """Voluntary context switches of every live thread of `pid` (0 once it exited)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for line in (task / "status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
    return total


async def snapshot(
    addresses: Mapping[str, Sequence[str]], pids: Mapping[str, Sequence[int]]
) -> TransportSnapshot:
    """`addresses`: each process name's gRPC addresses (a service with several
    replicas or clusters has several); `pids`: each name's process ids."""
    taken = TransportSnapshot()
    names = [(name, address) for name, listed in addresses.items() for address in listed]
    answers = await asyncio.gather(
        *(process_sockets(address, public=name == "gateway") for name, address in names),
        return_exceptions=True,
    )
    for (name, _), answer in zip(names, answers, strict=True):
        if isinstance(answer, BaseException):
            continue  # a process that does not answer (a follower restarting) counts 0
        taken.sockets.setdefault(name, []).extend(answer)
    for name, ids in pids.items():
        taken.switches[name] = sum(voluntary_switches(pid) for pid in ids)
    return taken


def phase_transport(
    before: TransportSnapshot,
    after: TransportSnapshot,
    listening_ports: Mapping[int, str],
    etcd_ports: Sequence[int] = (),
) -> PhaseTransport:
    """The messages of the phase per link, from two snapshots.

    `listening_ports` names the process listening on each port of the mesh."""
    dialled_from = {
        count.local_port: name
        for name, counts in after.sockets.items()
        for count in counts
        if count.dialled
    }

    def peer(count: SocketCount) -> str:
        if count.dialled:
            if count.remote_port in etcd_ports:
                return ETCD
            return listening_ports.get(count.remote_port, OUTSIDE)
        return dialled_from.get(count.remote_port, LOAD_GENERATOR)

    links: Counter[tuple[str, str]] = Counter()
    sent: Counter[str] = Counter()
    received: Counter[str] = Counter()
    for name, counts in after.sockets.items():
        earlier = {count.socket_id: count for count in before.sockets.get(name, [])}
        for count in counts:
            was = earlier.get(count.socket_id)
            if was is None and peer(count) == LOAD_GENERATOR:
                continue  # the bench's own channelz and status calls, made between phases
            sent_now = count.sent - (was.sent if was else 0)
            received_now = count.received - (was.received if was else 0)
            other = peer(count)
            sent[name] += sent_now
            received[name] += received_now
            # Each link is counted from the side that listens, once (and from the
            # dialling side only when the other end is not a mesh process).
            if not count.dialled or other in (ETCD, OUTSIDE):
                links[(name, other)] += sent_now
                links[(other, name)] += received_now
    switches = {
        name: after.switches.get(name, 0) - before.switches.get(name, 0) for name in after.switches
    }
    return PhaseTransport(dict(links), dict(sent), dict(received), switches)
