"""Golden logs: every record a simulated mesh's shard and matcher leaders committed, as
the release that wrote them decided them, with each group's final state hash.

`python -m tests.upgrade.golden_logs --write` records them from one seed of `oms sim`
(its etcd keeping every record: nothing truncated) into `tests/upgrade/golden/`.
`test_golden_logs.py` replays each with today's code at the log's own version: every
CHECKPOINT entry in it checks the replay's state hash against the leader's of the
release that wrote it, and the final hash must match. A failing replay means this
code decides version 1's log differently: put the change behind a new state-machine
version (README, "Upgrades"). Write them again only when a release is cut, never to
make a failing replay pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.markets.catalog import Market, load_catalog
from services.matcher.core import MatcherMachine
from services.runtime.core.log_batch import LogBatch, decode_batch_at
from services.runtime.core.replica import Replica
from services.shard.core.shard_machine import ShardMachine
from simulation.core import etcd_model
from simulation.core.replica_node import CHECKPOINT_INTERVAL_ENTRIES
from simulation.core.world import SimConfig, SimWorld, engine_settings, shard_settings

FOLDER = Path(__file__).parent / "golden"
INDEX = FOLDER / "golden.json"
SEED = 3
STEPS = 40_000


@dataclass(frozen=True, slots=True)
class GoldenLog:
    group: str
    kind: str  # "shard" or "matcher"
    records: int
    last_position: int
    final_hash: str
    file: str


def new_replica(kind: str, group: str, markets: tuple[Market, ...]) -> Replica[Any]:
    machine: ShardMachine | MatcherMachine
    if kind == "shard":
        machine = ShardMachine(shard_settings(group, markets))
    else:
        machine = MatcherMachine(engine_settings(group, markets))
    return Replica(machine, CHECKPOINT_INTERVAL_ENTRIES)


def batches(data: bytes) -> Iterator[LogBatch]:
    offset = 0
    while offset < len(data):
        batch, offset = decode_batch_at(data, offset)
        yield batch


def replay(kind: str, group: str, data: bytes, markets: tuple[Market, ...]) -> Replica[Any]:
    """Every record applied from position 1 (CHECKPOINT entries verified)."""
    replica = new_replica(kind, group, markets)
    for batch in batches(data):
        replica.apply_batch(batch)
    return replica


def write() -> list[GoldenLog]:
    markets = load_catalog().markets
    keep_everything = etcd_model.SimEtcd.truncate_before
    etcd_model.SimEtcd.truncate_before = lambda self, group, position: 0  # type: ignore[method-assign]
    try:
        world = SimWorld(SimConfig(seed=SEED, steps=STEPS, markets=markets))
        result = world.run()
    finally:
        etcd_model.SimEtcd.truncate_before = keep_everything  # type: ignore[method-assign]
    if not result.ok:
        raise SystemExit(f"seed {SEED} did not run clean: {result.violations}")
    FOLDER.mkdir(exist_ok=True)
    written = []
    for group, records in sorted(world.etcd.logs.items()):
        kind = "shard" if group in world.shard_settings else "matcher"
        data = b"".join(record.data for record in records)
        replica = replay(kind, group, data, markets)
        name = f"{kind}-{group}.log.z"
        (FOLDER / name).write_bytes(zlib.compress(data, 9))
        written.append(
            GoldenLog(
                group,
                kind,
                len(records),
                records[-1].last_position,
                replica.machine.state_hash().hex(),
                name,
            )
        )
    index = {
        "seed": SEED,
        "steps": STEPS,
        "logs": [dataclasses.asdict(log) for log in written],
    }
    INDEX.write_text(json.dumps(index, indent=1) + "\n")
    return written


def read() -> list[GoldenLog]:
    index = json.loads(INDEX.read_text())
    return [GoldenLog(**entry) for entry in index["logs"]]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="record the golden logs again")
    if parser.parse_args().write:
        for log in write():
            print(f"{log.file}: {log.records} records, through {log.last_position}")
