"""etcd endpoints as operators write them: host names, several endpoints, IPv4 and IPv6
addresses, URLs, and one endpoint down.

Before this, a list of host names (what the Kubernetes manifests give:
`etcd-0.etcd:2379,...`) became the gRPC target `ipv4:etcd-0.etcd:2379,...`, which
gRPC refuses; no test had given the adapter a host name. Here a real etcd of the
test's own listens on 127.0.0.1 and on [::1], and is named `localhost`; an endpoint
that is down is a port nobody listens on, or a proxy the test closes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_endpoints import (
    EndpointError,
    EtcdEndpoint,
    channel_targets,
    parse_endpoint,
    parse_endpoints,
)
from services.coordination.etcd_session import BlockingLeaseRenewer, EtcdSession, prefix_end
from services.infra.embedded_etcd import EmbeddedEtcd
from services.infra.ports import free_ports
from tests.sharding.freezing_proxy import FreezingProxy

pytestmark = [pytest.mark.timeout(60)]
PREFIX = b"/test/endpoints/"


@pytest.mark.parametrize(
    ("written", "host", "port", "family"),
    [
        ("etcd-0.etcd:2379", "etcd-0.etcd", 2379, None),
        ("etcd-0.etcd", "etcd-0.etcd", 2379, None),
        ("localhost:12379", "localhost", 12379, None),
        ("127.0.0.1:2379", "127.0.0.1", 2379, "ipv4"),
        ("[::1]:2379", "::1", 2379, "ipv6"),
        ("[fd00::5]", "fd00::5", 2379, "ipv6"),
        ("fd00::5", "fd00::5", 2379, "ipv6"),
        ("http://etcd-1.etcd:2379", "etcd-1.etcd", 2379, None),
        ("http://[::1]:4001/", "::1", 4001, "ipv6"),
        ("HTTP://10.0.0.7", "10.0.0.7", 2379, "ipv4"),
        ("  etcd:2379 ", "etcd", 2379, None),
    ],
)
def test_an_endpoint_is_read_as_operators_write_it(
    written: str, host: str, port: int, family: str | None
) -> None:
    endpoint = parse_endpoint(written)
    assert endpoint == EtcdEndpoint(host, port)
    assert endpoint.family == family


@pytest.mark.parametrize(
    ("written", "host", "port"),
    [
        ("https://etcd-0.etcd:2379", "etcd-0.etcd", 2379),
        ("HTTPS://[::1]:4001/", "::1", 4001),
        ("https://10.0.0.7", "10.0.0.7", 2379),
    ],
)
def test_an_https_endpoint_asks_for_tls(written: str, host: str, port: int) -> None:
    assert parse_endpoint(written) == EtcdEndpoint(host, port, tls=True)


def test_a_list_is_all_tls_or_all_plaintext() -> None:
    assert all(endpoint.tls for endpoint in parse_endpoints(["https://a:1,https://b:2"]))
    with pytest.raises(EndpointError, match="mix https"):
        parse_endpoints(["https://a:1", "b:2"])


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        ("", "expected host:port"),
        ("etcd:0", "port"),
        ("etcd:65536", "port"),
        ("etcd:http", "port"),
        (":2379", "no host"),
        ("[::1", "malformed"),
        ("[etcd]:2379", "not an IPv6"),
        ("http://etcd:2379/v3", "expected host:port"),
        ("http://user@etcd:2379", "expected host:port"),
        ("https://etcd:2379/v3", "expected host:port"),
    ],
)
def test_an_endpoint_that_cannot_be_one_is_refused_with_the_reason(
    written: str, reason: str
) -> None:
    with pytest.raises(EndpointError, match=reason):
        parse_endpoint(written)


def test_a_list_is_split_on_commas_and_must_not_be_empty() -> None:
    assert parse_endpoints(["a:1,b:2", "c"]) == (
        EtcdEndpoint("a", 1),
        EtcdEndpoint("b", 2),
        EtcdEndpoint("c", 2379),
    )
    with pytest.raises(EndpointError, match="no etcd endpoint"):
        parse_endpoints([" , "])


def test_addresses_of_one_family_share_a_channel_and_names_get_one_each() -> None:
    def targets(*written: str) -> tuple[str, ...]:
        return channel_targets(parse_endpoints(written))

    assert targets("10.0.0.1:2379", "10.0.0.2:2379") == ("ipv4:10.0.0.1:2379,10.0.0.2:2379",)
    assert targets("[fd00::1]:2379", "fd00::2") == ("ipv6:[fd00::1]:2379,[fd00::2]:2379",)
    assert targets("127.0.0.1:2379") == ("ipv4:127.0.0.1:2379",)
    assert targets("etcd-0.etcd:2379", "etcd-1.etcd:2379") == (
        "dns:///etcd-0.etcd:2379",
        "dns:///etcd-1.etcd:2379",
    )
    assert targets("10.0.0.1:2379", "[::1]:2379") == ("ipv4:10.0.0.1:2379", "ipv6:[::1]:2379")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    (ipv6_port,) = free_ports(1)
    server = EmbeddedEtcd(
        tmp_path_factory.mktemp("etcd-endpoints"),
        unsafe_no_fsync=True,
        extra_client_urls=[f"http://[::1]:{ipv6_port}"],
    )
    server.ipv6_port = ipv6_port  # type: ignore[attr-defined]
    with server:
        yield server


def _named(etcd: EmbeddedEtcd) -> str:
    return f"localhost:{etcd.client_port}"


def _down() -> str:
    (port,) = free_ports(1)  # nobody listens: connections are refused
    return f"localhost:{port}"


async def _round_trip(session: EtcdSession, name: bytes) -> None:
    """A put, a get, a fenced transaction, a watch from a revision and a lease."""
    key = PREFIX + name
    await session.put(key, b"one")
    entry = await session.get(key)
    assert entry is not None and entry.value == b"one"
    created, held = await session.create(key + b"/created", b"x", lease=0)
    assert created and held is not None
    events = session.watch(key, prefix_end(key), from_revision=entry.mod_revision)
    async with asyncio.timeout(10):
        first = await anext(events)
    assert first.entry.value == b"one"
    await events.aclose()
    lease = await session.grant_lease(5)
    assert await session.keep_alive(lease) > 0
    await session.revoke_lease(lease)


async def test_a_host_name_alone(etcd: EmbeddedEtcd) -> None:
    async with EtcdSession((_named(etcd),)) as session:
        await _round_trip(session, b"named")


async def test_an_ipv6_address_and_a_url(etcd: EmbeddedEtcd) -> None:
    ipv6 = f"[::1]:{etcd.ipv6_port}"  # type: ignore[attr-defined]
    async with EtcdSession((ipv6,)) as session:
        await _round_trip(session, b"ipv6")
    async with EtcdSession((f"http://{_named(etcd)}/",)) as session:
        await _round_trip(session, b"url")


async def test_a_name_among_several_endpoints_with_the_first_ones_down(
    etcd: EmbeddedEtcd,
) -> None:
    """The order Kubernetes gives (several names, a member not up yet): every call of
    a new session works, the first included."""
    ipv6 = f"http://[::1]:{etcd.ipv6_port}"  # type: ignore[attr-defined]
    endpoints = (_down(), f"127.0.0.1:{free_ports(1)[0]}", _named(etcd), ipv6)
    async with EtcdSession(endpoints) as session:
        await _round_trip(session, b"several")


async def test_the_lease_renewer_thread_reaches_a_named_endpoint_past_one_down(
    etcd: EmbeddedEtcd,
) -> None:
    async with EtcdSession((_named(etcd),)) as session:
        lease = await session.grant_lease(5)
        renewer = BlockingLeaseRenewer((_down(), _named(etcd)), timeout_s=2.0)
        try:
            answers: list[int] = []
            for _ in range(2):  # the endpoint down costs at most one renewal
                try:
                    answers.append(await asyncio.to_thread(renewer.keep_alive, lease))
                    break
                except CoordinationUnavailable:
                    continue
            assert answers and answers[0] > 0
        finally:
            renewer.close()
            await session.revoke_lease(lease)


async def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_an_endpoint_lost_mid_session_costs_at_most_one_call(etcd: EmbeddedEtcd) -> None:
    """Two names for the same etcd, each through a proxy of the test's. The session
    starts while only the first proxy listens, so its calls go there; the second comes
    up, then the first goes away: at most one call fails (the one in flight, or the
    first after), then every call goes to the second."""
    first = FreezingProxy(etcd.endpoint)
    second = FreezingProxy(etcd.endpoint, port=free_ports(1)[0])
    await first.start()
    try:
        named = [f"localhost:{first.endpoint.rpartition(':')[2]}", f"localhost:{second.port}"]
        async with EtcdSession(named, timeout_s=2.0) as session:
            await session.put(PREFIX + b"lost", b"before")
            assert next(iter(session.endpoint_states())) == f"dns:///{named[0]}"
            await second.start()
            await _until(
                lambda: session.endpoint_states()[f"dns:///{named[1]}"] == "READY",
                10,
                "the second endpoint's channel never connected",
            )
            await first.close()
            failures = 0
            for count in range(20):
                try:
                    await session.put(PREFIX + b"lost", str(count).encode())
                except CoordinationUnavailable:
                    failures += 1
            assert failures <= 1
            assert next(iter(session.endpoint_states())) == f"dns:///{named[1]}"
            entry = await session.get(PREFIX + b"lost")
            assert entry is not None and entry.value == b"19"
            assert second.connections > 0
    finally:
        await first.close()
        await second.close()
