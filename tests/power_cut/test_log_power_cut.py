"""Power cuts under the runtime's log: nothing acknowledged is lost, and a build that forgot
`O_DSYNC` is caught.

The SIGKILL test (`tests/runtime/test_crash_recovery.py`) kills the writer, but the
kernel keeps what it wrote: a log that never synced would pass it. Here the writer's
folder is on `PowerCutDisk`, which loses every write not synced when its power goes.
Each round: `crash_writer.py` (a `RuntimeNode`: the file log, snapshots, truncation)
recovers and acknowledges batches; then its whole process group is SIGKILLed (the
snapshot child too) and the power is cut; the disk comes back with what was synced,
and this process recovers it: every acknowledged batch must be there, at its
position, the state exactly the model's (`check_recovered`).

The control runs the same writer with the log's `O_DSYNC` taken away: after one
cut, an acknowledged batch is missing, so the check above fails for such a build.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from pathlib import Path

import pytest

from tests.power_cut.power_cut_disk import PowerCutDisk, unavailable
from tests.runtime import crash_writer
from tests.runtime.test_crash_recovery import (
    EXIT_TIMEOUT_S,
    Ack,
    Model,
    Recovered,
    WriterProcess,
    check_recovered,
    check_round_acks,
    drain,
    group_members,
    parse_acks,
    recover_in_test_process,
    run_one_round,
    wait_for_exit,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable() is not None, reason=f"power-cut disk: {unavailable()}"),
]
CUTS = 8
SEED = 20_261_204


def cut_power(writer: WriterProcess, disk: PowerCutDisk) -> list[Ack]:
    """Everything stops at once: the writer's process group, then the disk. Returns the
    acknowledgements the writer printed before it died."""
    children = group_members(writer.pid, exclude=writer.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(writer.pid, signal.SIGKILL)
    writer.process.wait(timeout=EXIT_TIMEOUT_S)
    writer.reaped = True
    wait_for_exit(children, EXIT_TIMEOUT_S)
    acks = parse_acks(drain(writer))
    disk.cut()
    return acks


def test_a_power_cut_never_loses_an_acknowledged_batch(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    all_acks: list[Ack] = []
    model = Model()
    previous: Recovered | None = None
    with (
        PowerCutDisk(tmp_path / "power") as disk,
        (tmp_path / "writer-stderr.log").open("ab") as stderr,
    ):
        data_dir = disk.root / "node"
        while disk.cuts < CUTS:
            writer = WriterProcess(data_dir, stderr)
            try:
                round_acks = run_one_round(writer, rng, previous)
                round_acks += cut_power(writer, disk)
            finally:
                writer.cleanup()
            check_round_acks(round_acks, previous)
            all_acks += round_acks
            disk.mount()
            recovered = asyncio.run(recover_in_test_process(data_dir))
            if previous is not None:
                assert recovered.applied_position >= previous.applied_position
            check_recovered(recovered, all_acks, model)
            previous = recovered
    assert previous is not None
    print(
        f"power cuts={disk.cuts} batches={model.applied_batches} acks={len(all_acks)}"
        f" position={previous.applied_position} snapshot={previous.snapshot_position}"
        f" log_starts_at={previous.log_first_position}"
    )
    assert model.applied_batches >= len(all_acks) > CUTS


def test_a_log_without_o_dsync_loses_acknowledged_batches_at_a_power_cut(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with (
        PowerCutDisk(tmp_path / "power") as disk,
        (tmp_path / "writer-stderr.log").open("ab") as stderr,
    ):
        data_dir = disk.root / "node"
        writer = WriterProcess(data_dir, stderr, {crash_writer.DROP_DSYNC_ENV: "1"})
        try:
            acks = run_one_round(writer, rng, None)
            acks += cut_power(writer, disk)
        finally:
            writer.cleanup()
        disk.mount()
        recovered = asyncio.run(recover_in_test_process(data_dir))
    # Lost outright, or gone from the log where a snapshot still counts it.
    with pytest.raises(AssertionError, match=r"was lost|is not where it was acknowledged"):
        check_recovered(recovered, acks, Model())
    print(f"acks={len(acks)}, recovered position {recovered.applied_position}")
