"""Applying log records to a state machine, identically on every replica.

The leader and every follower run the same `Replica.apply_batch`; the leader
merely formed the batch. Every time a batch crosses a multiple of
`checkpoint_interval_entries`, the replica hashes the machine's state at the
batch's last position. The leader later appends that hash as a CHECKPOINT entry,
and any replica (or a replay from disk) applying it compares it with its own
hash for that position: a mismatch is a determinism bug and stops the replica.

A VERSION entry switches the machine to a newer state-machine version at its
position. A replica whose build does not implement that version (or the version
of the snapshot it restores) stops before applying it, naming both, instead of
deciding the log's commands under rules the leader did not use. A VERSION entry
at or below the version in force changes nothing: an activation logged twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

from services.runtime.core.log_batch import LogBatch, decode_checkpoint, decode_version
from services.runtime.core.state_machine import ApplyContext, EntryKind, StateMachine

EgressT = TypeVar("EgressT")

_RECENT_HASHES_KEPT = 256
_NO_EGRESS: tuple[()] = ()
# Plain ints for the per-entry test: comparing with an IntEnum member costs about
# 0.1 µs per entry, as much as a small command's own apply.
_COMMAND = int(EntryKind.COMMAND)
_TIMER = int(EntryKind.TIMER)
_CHECKPOINT = int(EntryKind.CHECKPOINT)
_VERSION = int(EntryKind.VERSION)


class ReplicaInvariantError(RuntimeError):
    """The log handed to a replica breaks a runtime invariant; stop, do not limp on."""


class DivergenceError(ReplicaInvariantError):
    """This replica's state hash differs from the one the leader logged."""


class UnsupportedVersionError(ReplicaInvariantError):
    """The log or a snapshot is at a state-machine version this build does not implement."""


def describe_versions(versions: frozenset[int]) -> str:
    return ", ".join(str(version) for version in sorted(versions))


class Replica(Generic[EgressT]):
    def __init__(self, machine: StateMachine[EgressT], checkpoint_interval_entries: int) -> None:
        if checkpoint_interval_entries < 1:
            raise ValueError("checkpoint_interval_entries must be positive")
        self.machine = machine
        self.checkpoint_interval_entries = checkpoint_interval_entries
        self.applied_position = 0
        self.consensus_time_ms = 0
        self.checkpoints_verified = 0
        self.versions_repeated = 0  # VERSION entries at or below the version in force
        self._context = ApplyContext()
        self._recent_hashes: OrderedDict[int, bytes] = OrderedDict()

    def restore(self, data: bytes, position: int, consensus_time_ms: int) -> None:
        """Load a snapshot taken at `position`; the log continues at `position + 1`."""
        self.machine.restore(data)
        version = self.machine.version
        implemented = self.machine.implemented_versions
        if version not in implemented:
            raise UnsupportedVersionError(
                f"the snapshot at position {position} is at state-machine version {version};"
                f" this build implements versions {describe_versions(implemented)}: run a"
                f" build that implements version {version}"
            )
        self.applied_position = position
        self.consensus_time_ms = consensus_time_ms
        self._recent_hashes.clear()

    def apply_batch(self, batch: LogBatch) -> list[Sequence[EgressT]]:
        """Apply every entry of `batch`; return each entry's egress, in order."""
        if batch.first_position != self.applied_position + 1:
            raise ReplicaInvariantError(
                f"log gap: replica at {self.applied_position}, batch starts at "
                f"{batch.first_position}"
            )
        if batch.consensus_time_ms < self.consensus_time_ms:
            raise ReplicaInvariantError(
                f"consensus time went back from {self.consensus_time_ms} to "
                f"{batch.consensus_time_ms} at position {batch.first_position}"
            )
        context = self._context
        context.consensus_time_ms = batch.consensus_time_ms
        machine = self.machine
        outputs: list[Sequence[EgressT]] = []
        append = outputs.append
        position = batch.first_position
        for kind, payload in batch.entries:
            context.position = position
            if kind == _COMMAND:
                append(machine.apply(payload, context))
            elif kind == _TIMER:
                append(machine.on_timer(context))
            elif kind == _CHECKPOINT:
                self._verify_checkpoint(payload, position)
                append(_NO_EGRESS)
            elif kind == _VERSION:
                self._activate(decode_version(payload), position)
                append(_NO_EGRESS)
            else:
                raise ReplicaInvariantError(f"unknown entry kind {kind} at position {position}")
            position += 1
        last_position = position - 1
        self.applied_position = last_position
        self.consensus_time_ms = batch.consensus_time_ms
        interval = self.checkpoint_interval_entries
        if (batch.first_position - 1) // interval != last_position // interval:
            self._remember_hash(last_position, machine.state_hash())
        return outputs

    @property
    def latest_hash(self) -> tuple[int, bytes] | None:
        """The newest (position, state hash) this replica recorded."""
        if not self._recent_hashes:
            return None
        position = next(reversed(self._recent_hashes))
        return position, self._recent_hashes[position]

    def recorded_hashes(self) -> list[tuple[int, bytes]]:
        return list(self._recent_hashes.items())

    def _remember_hash(self, position: int, digest: bytes) -> None:
        self._recent_hashes[position] = digest
        while len(self._recent_hashes) > _RECENT_HASHES_KEPT:
            self._recent_hashes.popitem(last=False)

    def _activate(self, version: int, position: int) -> None:
        machine = self.machine
        in_force = machine.version
        if version <= in_force:
            self.versions_repeated += 1
            return
        implemented = machine.implemented_versions
        if version not in implemented:
            raise UnsupportedVersionError(
                f"the log activates state-machine version {version} at position {position}"
                f" (in force: {in_force}); this build implements versions"
                f" {describe_versions(implemented)}: this replica stops before applying it;"
                f" run a build that implements version {version}"
            )
        machine.activate_version(version)

    def _verify_checkpoint(self, payload: bytes, entry_position: int) -> None:
        hashed_position, leader_hash = decode_checkpoint(payload)
        if hashed_position >= entry_position:
            raise ReplicaInvariantError(
                f"checkpoint at {entry_position} refers to future position {hashed_position}"
            )
        own_hash = self._recent_hashes.get(hashed_position)
        if own_hash is None:
            return  # restored from a snapshot past that position, or aged out
        if own_hash != leader_hash:
            raise DivergenceError(
                f"state hash at position {hashed_position} is {own_hash.hex()} here but "
                f"{leader_hash.hex()} on the leader"
            )
        self.checkpoints_verified += 1
