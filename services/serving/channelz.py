"""gRPC's channelz on a service's server, when `OMS_CHANNELZ` asks for it.

Channelz (`grpc.channelz.v1.Channelz`, gRPC's own debug service) answers what the
process's gRPC holds: every server and channel, each connection's messages sent
and received, streams started and failed. `oms bench e2e` reads it from every
process to count the messages an order costs on each hop; an operator can read
it with `grpcdebug`. Off by default: on the gateway it would share the public port
(no key needed, like health), and in the mesh it answers any mesh certificate.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_channelz.v1.channelz import add_channelz_servicer

from services.settings import load_settings, setting

CHANNELZ_SERVICE = "grpc.channelz.v1.Channelz"


@dataclass(frozen=True)
class ChannelzSettings:
    enabled: bool = setting(
        env="OMS_CHANNELZ",
        default=False,
        help="serve gRPC's channelz (connections, messages per connection) on the service's port",
    )


def register_channelz(server: grpc.aio.Server) -> None:
    if load_settings(ChannelzSettings).enabled:
        add_channelz_servicer(server)
