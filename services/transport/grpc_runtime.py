"""gRPC's experiments, chosen in every `oms` process before gRPC is loaded.

gRPC reads `GRPC_EXPERIMENTS` once, when its library loads (`import grpc`); set
later, it changes nothing. grpcio 1.85's EventEngine client and listener cost a
quarter to a third more CPU per message on these machines than gRPC's older I/O
path, and in the whole mesh about 10 to 20% more per order below saturation
(`../shared/measurements/grpc-transport/EVENT_ENGINE.md`, and `oms bench e2e
--grpc-event-engine off,on`, which measures both side by side). So `oms` turns
them off unless the environment already says otherwise; `GRPC_EXPERIMENTS=` (empty)
keeps gRPC's own defaults. The choice depends on the grpcio version: pyproject.toml
pins the versions it was measured with, and the bench's A/B shows when an upgrade
changes it.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

GRPC_EXPERIMENTS = "GRPC_EXPERIMENTS"
MESH_GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def choose_grpc_experiments(environment: MutableMapping[str, str] = os.environ) -> str:
    """The mesh's experiments unless `environment` names its own; what is now set.
    Children started with this environment (`oms up`'s services) inherit it."""
    return environment.setdefault(GRPC_EXPERIMENTS, MESH_GRPC_EXPERIMENTS)
