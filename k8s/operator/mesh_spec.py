"""An OmsCluster's spec, read and checked: the clusters the mesh should have, its
whale pins and the waves' settings. Every problem is an `OmsClusterSpecError` naming
the field; the API server's schema (`base/operator/crd.yaml`) refuses most of them
before the operator sees them, but not all (map keys, pins to clusters not asked for).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_SHARDS = 64
MAX_WAVE_SIZE = 1_024
MAX_QUIESCE_S = 600
MAX_STATE_MACHINE_VERSION = 1_000_000
_USER_ID = re.compile(r"[1-9][0-9]{0,18}")
INT64_MAX = 2**63 - 1


class OmsClusterSpecError(ValueError):
    """A spec the operator cannot act on (the message says which field and why)."""


def cluster_ids(shards: int) -> tuple[str, ...]:
    """The clusters of a mesh of `shards` clusters: s1 .. sN."""
    return tuple(f"s{index}" for index in range(1, shards + 1))


@dataclass(frozen=True)
class MeshSpec:
    clusters: tuple[str, ...]
    pins: Mapping[int, str] = field(default_factory=dict)  # by user id
    wave_size: int = 64
    quiesce_s: float = 10.0
    # The state-machine version every replicated group should decide under (None: leave
    # them as they are): `version_rollout.py`.
    state_machine_version: int | None = None

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> MeshSpec:
        shards = spec.get("shards")
        if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
            raise OmsClusterSpecError(f"spec.shards: an integer from 1 to {MAX_SHARDS}")
        clusters = cluster_ids(shards)
        raw_pins = spec.get("pins") or {}
        if not isinstance(raw_pins, Mapping):
            raise OmsClusterSpecError("spec.pins: an object of user id -> cluster")
        pins: dict[int, str] = {}
        for key, cluster in raw_pins.items():
            if not isinstance(key, str) or not _USER_ID.fullmatch(key) or int(key) > INT64_MAX:
                raise OmsClusterSpecError(f"spec.pins: {key!r} is not a user id")
            if cluster not in clusters:
                raise OmsClusterSpecError(
                    f"spec.pins: user {key} is pinned to {cluster!r}, not one of "
                    f"the mesh's clusters {', '.join(clusters)}"
                )
            pins[int(key)] = cluster
        wave_size = _bounded(spec, "waveSize", 64, MAX_WAVE_SIZE)
        quiesce_s = _bounded(spec, "quiesceSeconds", 10, MAX_QUIESCE_S)
        version = None
        if "stateMachineVersion" in spec:
            version = _bounded(spec, "stateMachineVersion", 1, MAX_STATE_MACHINE_VERSION)
        pinned = dict(sorted(pins.items()))
        return cls(clusters, pinned, wave_size, float(quiesce_s), version)


def _bounded(spec: Mapping[str, Any], name: str, default: int, maximum: int) -> int:
    value = spec.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise OmsClusterSpecError(f"spec.{name}: an integer from 1 to {maximum}")
    return value
