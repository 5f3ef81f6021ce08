"""SIGKILL a real writer process over and over; nothing acknowledged may ever be lost.

`crash_writer.py` runs a `RuntimeNode` (CounterMachine, small segments, a snapshot every
5000 entries so forked snapshots and log truncation happen during the run) and prints
`ACK <first_position> <count> <batch_id>` once each numbered batch is durable. This test
kills it at a random moment after it starts acknowledging, recovers the folder in this
process, and checks that:

* every acknowledged batch is in the recovered state, at the logged positions it was
  acknowledged with (for the part of the log not yet truncated);
* the applied batches form a prefix 1..B and each is applied entirely or not at all: the
  whole counter map equals the state a model computes from batches 1..B;
* the durable prefix never shrinks, the restarted writer recovers the same position and
  state hash as this process did, and its log continues right after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import select
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from services.runtime.core.counter_machine import CounterMachine, encode_increment
from services.runtime.core.state_machine import EntryKind
from services.runtime.file_log import FileLogStore, list_segments
from tests.runtime import crash_writer

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("crash_writer.py")
KILLS = 22
SEED = 20_261_130
START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 15.0


# --- the child process --------------------------------------------------------------------


class WriterProcess:
    """One run of `crash_writer.py`; stdout is read as lines with deadlines, never by sleeping."""

    def __init__(
        self, data_dir: Path, stderr: IO[bytes], environment: dict[str, str] | None = None
    ) -> None:
        self.stderr_path = Path(stderr.name)
        environment = dict(os.environ, PYTHONPATH=str(REPO_ROOT), **(environment or {}))
        self.process = subprocess.Popen(
            [sys.executable, str(WRITER), str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env=environment,
            start_new_session=True,  # its own process group: the snapshot children too
        )
        assert self.process.stdout is not None
        self._stdout = self.process.stdout
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._stdout, selectors.EVENT_READ)
        self._buffer = b""
        self.eof = False
        self.reaped = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr_tail(self) -> str:
        return self.stderr_path.read_bytes()[-3000:].decode(errors="replace")

    def read_lines(self, deadline: float) -> list[str]:
        """Complete lines that arrive before `deadline` (returns as soon as some do)."""
        while not self.eof:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if not self._selector.select(remaining):
                return []
            chunk = os.read(self._stdout.fileno(), 1 << 16)
            if not chunk:
                self.eof = True  # a partial last line of a killed writer is dropped
                return []
            self._buffer += chunk
            if b"\n" in self._buffer:
                *lines, self._buffer = self._buffer.split(b"\n")
                return [line.decode() for line in lines]
        return []

    def kill_and_reap(self) -> list[int]:
        """SIGKILL the writer and reap it; return its orphaned (snapshot) children."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=EXIT_TIMEOUT_S)
        self.reaped = True
        # Dead, it forks no more; its children keep its process group id.
        return group_members(self.pid, exclude=self.pid)

    def cleanup(self) -> None:
        if not self.reaped:
            # The group id is still ours while the leader is unreaped: kill everything in it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(timeout=EXIT_TIMEOUT_S)
            self.reaped = True
        self._selector.close()
        self._stdout.close()


def group_members(group: int, exclude: int) -> list[int]:
    """Live (non-zombie) processes of process group `group`, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        state, _parent, process_group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(process_group) == group and state != "Z":
            members.append(int(entry))
    return members


def wait_for_exit(pids: list[int], timeout_s: float) -> None:
    """Wait (with pidfds, no polling) until every pid has exited; SIGKILL stragglers."""
    descriptors = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            descriptors.append(os.pidfd_open(pid))
    try:
        deadline = time.monotonic() + timeout_s
        pending = list(descriptors)
        while pending:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select(pending, [], [], max(remaining, 0))
            pending = [fd for fd in pending if fd not in ready]
            if pending and remaining <= 0:
                for fd in pending:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                deadline = time.monotonic() + timeout_s
    finally:
        for fd in descriptors:
            os.close(fd)


# --- what the test knows ------------------------------------------------------------------


@dataclass
class Ack:
    first_position: int
    count: int
    batch_id: int


@dataclass
class Recovered:
    applied_position: int
    snapshot_position: int
    state_hash: str
    counters: dict[int, int]
    log_first_position: int
    commands_by_position: dict[int, bytes]
    snapshot_files: int


@dataclass
class Model:
    """The exact counters that batches 1..applied_batches produce."""

    applied_batches: int = 0
    counters: dict[int, int] = field(default_factory=dict)

    def advance_to(self, last_batch: int) -> None:
        assert last_batch >= self.applied_batches, "the durable prefix shrank"
        for batch_id in range(self.applied_batches + 1, last_batch + 1):
            for key, delta in crash_writer.batch_commands(batch_id):
                self.counters[key] = self.counters.get(key, 0) + delta
        self.applied_batches = last_batch


async def recover_in_test_process(data_dir: Path) -> Recovered:
    node = crash_writer.node_for(data_dir)
    report = await node.recover()
    try:
        machine = node.replica.machine
        assert isinstance(machine, CounterMachine)
        store = node.log_store
        assert isinstance(store, FileLogStore)
        log_first = list_segments(data_dir / "log")[0].first_position
        commands = {}
        for batch in store.read_sync(log_first):
            for index, (kind, payload) in enumerate(batch.entries):
                if kind == EntryKind.COMMAND:
                    commands[batch.first_position + index] = payload
        return Recovered(
            applied_position=report.applied_position,
            snapshot_position=report.snapshot_position,
            state_hash=machine.state_hash().hex(),
            counters=dict(machine.counters),
            log_first_position=log_first,
            commands_by_position=commands,
            snapshot_files=len(node.snapshots.positions()),
        )
    finally:
        await node.close()


def check_recovered(recovered: Recovered, acks: list[Ack], model: Model) -> None:
    batch_ids = sorted(key for key in recovered.counters if key < crash_writer.SHARED_BASE)
    last_batch = batch_ids[-1] if batch_ids else 0
    assert batch_ids == list(range(1, last_batch + 1)), "applied batches are not a prefix"
    model.advance_to(last_batch)
    # All or nothing per batch, and nothing else: the whole state equals the model's.
    assert recovered.counters == model.counters
    for ack in acks:
        assert ack.batch_id <= last_batch, f"acknowledged batch {ack.batch_id} was lost"
        assert ack.first_position + ack.count - 1 <= recovered.applied_position
        expected = [encode_increment(k, d) for k, d in crash_writer.batch_commands(ack.batch_id)]
        assert ack.count == len(expected)
        if ack.first_position >= recovered.log_first_position:
            logged = [
                recovered.commands_by_position.get(ack.first_position + index)
                for index in range(ack.count)
            ]
            assert logged == expected, f"batch {ack.batch_id} is not where it was acknowledged"


def parse_recovered_line(line: str) -> tuple[int, int, str, int]:
    tag, applied, snapshot, _replayed, _torn, state_hash, next_batch = line.split()
    assert tag == "RECOVERED"
    return int(applied), int(snapshot), state_hash, int(next_batch)


# --- the test -------------------------------------------------------------------------------


def test_sigkill_never_loses_an_acknowledged_batch(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    data_dir = tmp_path / "node"
    all_acks: list[Ack] = []
    model = Model()
    previous: Recovered | None = None
    snapshot_recoveries = 0
    orphans_seen = 0
    kills = 0
    with (tmp_path / "writer-stderr.log").open("ab") as stderr:
        while kills < KILLS:
            writer = WriterProcess(data_dir, stderr)
            try:
                round_acks = run_one_round(writer, rng, previous)
                orphans = writer.kill_and_reap()
                kills += 1
                # A snapshot child of the killed writer may still be writing: let it finish.
                # Until then it holds the log's LOCK (see test_corruption) and our stdout.
                orphans_seen += len(orphans)
                wait_for_exit(orphans, EXIT_TIMEOUT_S)
                round_acks += parse_acks(drain(writer))
            finally:
                writer.cleanup()
            check_round_acks(round_acks, previous)
            all_acks += round_acks
            recovered = asyncio.run(recover_in_test_process(data_dir))
            if previous is not None:
                assert recovered.applied_position >= previous.applied_position
            check_recovered(recovered, all_acks, model)
            snapshot_recoveries += recovered.snapshot_position > 0
            previous = recovered
    assert previous is not None
    print(
        f"kills={kills} batches={model.applied_batches} acks={len(all_acks)} "
        f"position={previous.applied_position} snapshot_recoveries={snapshot_recoveries} "
        f"orphaned_snapshot_children={orphans_seen} log_starts_at={previous.log_first_position}"
    )
    # The run really exercised snapshots and log truncation.
    assert snapshot_recoveries > 0
    assert previous.snapshot_files >= 1
    assert previous.log_first_position > 1
    assert model.applied_batches > KILLS


def run_one_round(
    writer: WriterProcess, rng: random.Random, previous: Recovered | None
) -> list[Ack]:
    """Read the recovery line and ACKs until a random moment after the first ACK."""
    start_deadline = time.monotonic() + START_TIMEOUT_S
    acks: list[Ack] = []
    recovered_line = None
    while not acks:
        lines = writer.read_lines(start_deadline)
        if not lines and (writer.eof or time.monotonic() >= start_deadline):
            raise AssertionError(
                f"writer produced no ACK (exit code {writer.process.poll()}); its stderr ends "
                f"with:\n{writer.stderr_tail()}"
            )
        for line in lines:
            if line.startswith("RECOVERED"):
                recovered_line = line
            else:
                acks += parse_acks([line])
    assert recovered_line is not None
    applied, _snapshot, state_hash, next_batch = parse_recovered_line(recovered_line)
    if previous is not None:
        # The writer recovered exactly what this process recovered after the last kill.
        assert (applied, state_hash) == (previous.applied_position, previous.state_hash)
        assert (
            next_batch
            == max((k for k in previous.counters if k < crash_writer.SHARED_BASE), default=0) + 1
        )
        # ... and its log continues right after it.
        assert acks[0].first_position > previous.applied_position
    assert acks[0].batch_id == next_batch
    kill_at = time.monotonic() + rng.uniform(0.020, 0.300)
    while time.monotonic() < kill_at and not writer.eof:
        acks += parse_acks(writer.read_lines(kill_at))
    return acks


def drain(writer: WriterProcess) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while not writer.eof and time.monotonic() < deadline:
        lines += writer.read_lines(deadline)
    assert writer.eof, "the killed writer's stdout never closed"
    return lines


def parse_acks(lines: list[str]) -> list[Ack]:
    acks = []
    for line in lines:
        tag, first_position, count, batch_id = line.split()
        assert tag == "ACK", line
        acks.append(Ack(int(first_position), int(count), int(batch_id)))
    return acks


def check_round_acks(acks: list[Ack], previous: Recovered | None) -> None:
    """Within one run, batches are acknowledged in order at increasing positions."""
    for before, after in itertools.pairwise(acks):
        assert after.batch_id == before.batch_id + 1
        assert after.first_position >= before.first_position + before.count
    if previous is not None and acks:
        assert acks[0].first_position > previous.applied_position
