"""`oms` turns gRPC's EventEngine client and listener off unless told otherwise.

gRPC reads GRPC_EXPERIMENTS once, as it loads: the choice is made in `oms`'s `main`
before any subcommand imports gRPC, and children (`oms up`'s services) inherit it.
"""

from __future__ import annotations

import subprocess
import sys

from services.transport.grpc_runtime import (
    GRPC_EXPERIMENTS,
    MESH_GRPC_EXPERIMENTS,
    choose_grpc_experiments,
)


def test_the_mesh_setting_unless_the_environment_has_one() -> None:
    environment: dict[str, str] = {}
    assert choose_grpc_experiments(environment) == MESH_GRPC_EXPERIMENTS
    assert environment[GRPC_EXPERIMENTS] == MESH_GRPC_EXPERIMENTS
    # Empty is a choice too: gRPC's own defaults.
    assert choose_grpc_experiments({GRPC_EXPERIMENTS: ""}) == ""
    assert choose_grpc_experiments({GRPC_EXPERIMENTS: "-event_engine_client"}) == (
        "-event_engine_client"
    )


def test_the_oms_entry_point_loads_no_grpc_before_it_chooses() -> None:
    """`main` chooses before it imports the subcommand's module: importing the entry
    point itself must not load gRPC, or the choice would come too late."""
    probe = "import sys, services.command_line; print('grpc' in sys.modules)"
    printed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert printed.stdout.strip() == "False"
