"""The shard's state-machine versions: the rule sets this build can decide under.

Version 1 is every decision the shard has made since replicas first compared state
hashes. A change to what the machine decides from the same log (a new refusal, a
changed rounding, a field its state hash covers) is a new version: the new rule is
written behind `state.machine_version >= N`, the old one kept, N added here, and the
group switches at the VERSION entry `oms upgrade activate` logs once every replica
runs a build that implements N (README, "Upgrades"). A change that decides nothing
differently (a faster structure, a log line, a new metric) needs no version.
"""

from __future__ import annotations

IMPLEMENTED_VERSIONS: frozenset[int] = frozenset({1})
