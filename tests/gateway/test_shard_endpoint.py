"""The gateway's queries to a shard that came up after their channel first failed.

A fresh clone once failed the trace test with `GetActor` answering UNAVAILABLE
while the shard served: the gateway's query channel had tried to connect before
the shard was up, and a call made while a channel is in reconnect back-off
(TRANSIENT_FAILURE) fails at once unless it waits for the channel. The queries
now wait for it within their deadline; only a shard the link knows to be away is
refused at once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.core.refusals import GatewayError
from gateway.shard_endpoint import ShardEndpoint
from gateway.statistics import GatewayCounters
from services.coordination.addresses import FixedAddress
from services.infra.ports import free_port
from tests.shard_service.shard_process import ShardProcess

ROUNDS = 3  # queries made right as the shard serves, each on a channel backing off


async def test_a_query_made_while_its_channel_backs_off_waits_for_the_shard(
    tmp_path: Path,
) -> None:
    port = free_port()
    for round_number in range(ROUNDS):
        endpoint = ShardEndpoint(
            FixedAddress(f"127.0.0.1:{port}"), timeout_s=0.3, counters=GatewayCounters()
        )
        try:
            # Nothing listens yet: the channel's connects fail and it backs off.
            with pytest.raises(GatewayError):
                await endpoint.actor(7)
            with ShardProcess(tmp_path / f"data-{round_number}", port=port):
                endpoint.timeout_s = 5.0
                started = time.monotonic()
                view = await endpoint.actor(7, orders_only=True)
                assert not view.resident
                assert time.monotonic() - started < endpoint.timeout_s
                assert (await endpoint.applied_position()) >= 0
        finally:
            await endpoint.close()
