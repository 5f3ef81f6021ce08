"""Where each matcher group listens, and which group owns each symbol.

The mesh names matcher addresses in one setting, `OMS_MATCHERS`
("g1=127.0.0.1:7301,g2=127.0.0.1:7302", or "g1=etcd" for the group's leader
as its leader key in etcd names it); symbols map to groups through the
market catalog, so the gateway, the bridge and the reconciler route alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.coordination.addresses import AddressSource, address_source
from services.markets.catalog import MarketCatalog


class MatcherDirectoryError(ValueError):
    """The matcher addresses are malformed or miss a group the catalog uses."""


@dataclass(frozen=True)
class MatcherDirectory:
    addresses: Mapping[str, str]  # matcher group -> host:port
    groups_by_symbol: Mapping[str, str]

    @classmethod
    def parse(cls, text: str, catalog: MarketCatalog) -> MatcherDirectory:
        addresses: dict[str, str] = {}
        for raw in text.split(","):
            part = raw.strip()
            if not part:
                continue
            group, separator, address = part.partition("=")
            if not separator or not group.strip() or not address.strip():
                raise MatcherDirectoryError(f"expected group=host:port, got {part!r}")
            addresses[group.strip()] = address.strip()
        missing = [group for group in catalog.groups() if group not in addresses]
        if missing:
            raise MatcherDirectoryError(f"no address for matcher group(s) {', '.join(missing)}")
        groups = {market.symbol: market.matcher_group for market in catalog.markets}
        return cls(addresses, groups)

    def sources(self, etcd_endpoints: Sequence[str], mesh_id: str) -> dict[str, AddressSource]:
        """Each group's address as a source: fixed, or its leader found in etcd."""
        return {
            group: address_source(
                address,
                kind="matcher",
                name=group,
                etcd_endpoints=etcd_endpoints,
                mesh_id=mesh_id,
            )
            for group, address in sorted(self.addresses.items())
        }

    def group_of(self, symbol: str) -> str | None:
        return self.groups_by_symbol.get(symbol)

    def format(self) -> str:
        return ",".join(f"{group}={address}" for group, address in self.addresses.items())
