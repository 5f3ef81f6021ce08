"""The matcher's state-machine versions: the rule sets this build can decide under.

Version 1 is every decision the matching engine has made since replicas first
compared state hashes. A change to what it decides from the same log (a changed
fee rounding, a new refusal, a field its state hash covers) is a new version: the
new rule is written behind `engine.machine_version >= N`, the old one kept, N added
here, and the group switches at the VERSION entry `oms upgrade activate` logs once
every replica runs a build that implements N (README, "Upgrades"). A change that
decides nothing differently needs no version.

Version 2 adds the market-data feed (`market_feed`): from the VERSION entry on, every
entry also publishes per symbol its public trades and one book update, sequenced per
symbol and retained; the feed's sequences, windows and digests are in the snapshot
(layout 3) and the state hash. Orders are decided as in version 1.
"""

from __future__ import annotations

IMPLEMENTED_VERSIONS: frozenset[int] = frozenset({1, 2})
