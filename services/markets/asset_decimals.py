"""How many decimals each asset's minor unit has, for showing amounts to people.

Display only: the system keeps integers in each asset's minor unit (the catalog's units,
`default_markets.toml`); `oms demo` and the market-data commands print them in the
asset's own unit with these. An asset not listed is printed in minor units.
"""

from __future__ import annotations

ASSET_DECIMALS: dict[str, int] = {"BTC": 8, "ETH": 8, "SOL": 9, "USDT": 6}
