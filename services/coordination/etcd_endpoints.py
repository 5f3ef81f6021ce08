"""etcd endpoints as operators write them, and the gRPC channels that reach them.

`OMS_ETCD_ENDPOINTS` (and `--etcd`) is a comma-separated list; each endpoint is
`host:port`, `host` (port 2379), `[ipv6]:port`, a bare IPv6 address, or a URL
`http://host:port` as etcd's own flags and etcdctl write them. The host may be a
name (`etcd-0.etcd`, as a Kubernetes StatefulSet's headless service gives), an
IPv4 or an IPv6 address.

gRPC has no target that lists several host names (`ipv4:a:p,b:q` takes addresses
only and refuses names: "the target uri is not valid"), so:

- several addresses of one family become one channel over all of them
  (`ipv4:a:p,b:q`), which gRPC's `round_robin` balances: a member's loss is
  invisible to callers;
- anything else (names, or IPv4 beside IPv6) becomes one channel per endpoint,
  each resolved by gRPC's DNS resolver again whenever it reconnects (a pod that
  comes back with another address is found), and the session moves to the next
  endpoint when one fails (`ChannelRing`).

The scheme chooses TLS, as with etcdctl: `https://` endpoints are reached over TLS
(mutual: the caller presents its certificate, `etcd_credentials`), anything else in
plaintext. A list that mixes the two is refused: an endpoint written `https://` must
never be reached without TLS because another in the list was not.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

DEFAULT_CLIENT_PORT = 2379
_SCHEMES = ("http://", "https://")


class EndpointError(ValueError):
    """An etcd endpoint that cannot be read; the message names it and says why."""


@dataclass(frozen=True, slots=True)
class EtcdEndpoint:
    host: str  # a name, an IPv4 address, or an IPv6 address without brackets
    port: int
    tls: bool = False  # written https://

    @property
    def family(self) -> str | None:
        """`ipv4` or `ipv6` for an address, None for a name."""
        try:
            address = ipaddress.ip_address(self.host)
        except ValueError:
            return None
        return "ipv4" if address.version == 4 else "ipv6"

    @property
    def authority(self) -> str:
        """`host:port`, with an IPv6 address in brackets."""
        host = f"[{self.host}]" if self.family == "ipv6" else self.host
        return f"{host}:{self.port}"


def parse_endpoint(text: str) -> EtcdEndpoint:
    """One endpoint as written; `EndpointError` when it cannot be one."""
    written = text.strip()
    rest = written
    tls = False
    for scheme in _SCHEMES:
        if rest.lower().startswith(scheme):
            tls = scheme == "https://"
            rest = rest[len(scheme) :]
            break
    rest = rest.rstrip("/")
    if not rest or "/" in rest or "@" in rest or "?" in rest:
        raise EndpointError(f"etcd endpoint {written!r}: expected host:port, [ipv6]:port or a URL")
    if rest.startswith("["):
        host, bracket, after = rest[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise EndpointError(f"etcd endpoint {written!r}: unclosed or malformed [ipv6]")
        port_text = after[1:] if after else ""
        _require_ipv6(host, written)
    elif rest.count(":") > 1:
        host, port_text = rest, ""  # a bare IPv6 address
        _require_ipv6(host, written)
    else:
        host, _, port_text = rest.partition(":")
        if not host:
            raise EndpointError(f"etcd endpoint {written!r}: no host")
    return EtcdEndpoint(host, _port(port_text, written), tls)


def parse_endpoints(texts: Sequence[str]) -> tuple[EtcdEndpoint, ...]:
    """Every endpoint of a list (items may themselves hold commas); at least one, all
    TLS (`https://`) or none."""
    parts = [part for text in texts for part in text.split(",") if part.strip()]
    if not parts:
        raise EndpointError("no etcd endpoint given")
    endpoints = tuple(parse_endpoint(part) for part in parts)
    if len({endpoint.tls for endpoint in endpoints}) > 1:
        raise EndpointError(
            f"etcd endpoints {','.join(parts)!r} mix https:// with plaintext: "
            "write every one https:// (TLS) or none"
        )
    return endpoints


def uses_tls(texts: Sequence[str]) -> bool:
    """Whether the endpoints are reached over TLS (written `https://`)."""
    return parse_endpoints(texts)[0].tls


def channel_targets(endpoints: Sequence[EtcdEndpoint]) -> tuple[str, ...]:
    """The gRPC targets to open: one over every address when they are all addresses of
    one family, else one per endpoint (each a `dns:///` target for a name)."""
    families = {endpoint.family for endpoint in endpoints}
    if len(endpoints) > 1 and len(families) == 1 and None not in families:
        (family,) = families
        return (f"{family}:" + ",".join(endpoint.authority for endpoint in endpoints),)
    return tuple(_single_target(endpoint) for endpoint in endpoints)


def _single_target(endpoint: EtcdEndpoint) -> str:
    if endpoint.family is None:
        return f"dns:///{endpoint.authority}"
    return f"{endpoint.family}:{endpoint.authority}"


def _require_ipv6(host: str, written: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError as error:
        raise EndpointError(
            f"etcd endpoint {written!r}: {host!r} is not an IPv6 address"
        ) from error


def _port(text: str, written: str) -> int:
    if not text:
        return DEFAULT_CLIENT_PORT
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise EndpointError(f"etcd endpoint {written!r}: port {text!r} is not 1 to 65535")
    return int(text)


T = TypeVar("T")


class ChannelRing(Generic[T]):
    """One channel (or client) per target, and which one calls go to now.

    Calls go to the current one until it fails (`failed`); then to the next that
    gRPC says is connected, else simply the next. A ring of one never moves.
    """

    def __init__(
        self,
        targets: Sequence[str],
        open_channel: Callable[[str], T],
        is_connected: Callable[[T], bool],
    ) -> None:
        if not targets:
            raise EndpointError("no etcd endpoint given")
        self.targets = tuple(targets)
        self._open = open_channel
        self._is_connected = is_connected
        self._channels: dict[int, T] = {}
        self.index = 0
        self.moves = 0

    @property
    def current(self) -> T:
        return self._at(self.index)

    def opened(self) -> list[T]:
        return list(self._channels.values())

    def every(self) -> list[T]:
        """Every target's channel, opened if it was not."""
        return [self._at(index) for index in range(len(self.targets))]

    def prefer(self, channel: T) -> None:
        """Send calls to `channel` (one of this ring's) from now on."""
        for index, opened in self._channels.items():
            if opened is channel:
                self.index = index
                return
        raise ValueError("not a channel of this ring")

    def failed(self, channel: T) -> None:
        """`channel` failed a call: later calls go elsewhere (if it is still the current
        one: a failure reported late must not move the ring off a good channel)."""
        if len(self.targets) == 1 or self._channels.get(self.index) is not channel:
            return
        count = len(self.targets)
        following = [(self.index + step) % count for step in range(1, count)]
        connected = [
            index
            for index in following
            if index in self._channels and self._is_connected(self._channels[index])
        ]
        self.index = connected[0] if connected else following[0]
        self.moves += 1

    def _at(self, index: int) -> T:
        channel = self._channels.get(index)
        if channel is None:
            channel = self._channels[index] = self._open(self.targets[index])
        return channel
