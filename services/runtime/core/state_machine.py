"""The API every replicated state machine implements.

A state machine sees only logged input: commands (opaque bytes it decodes
itself) and timer ticks, each with an `ApplyContext` carrying the log position
and the consensus time the leader stamped on the batch. It returns egress, which
the runtime releases only once the entry is durable, and only from the leader.

Its decisions are made under a **state-machine version**: the rules of one release
of its code. A build implements a set of versions (`implemented_versions`: the new
rules and every older rule set it keeps), and decides under the one in force
(`version`, part of its state: snapshot and hash), which changes only at a VERSION
entry of the log (`activate_version`), at the same position on every replica. So
replicas running different builds decide alike until the group switches, and a
build that does not implement the log's version stops before applying it
(`services/runtime/core/replica.py`, `UnsupportedVersionError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Protocol, TypeVar

EgressT_co = TypeVar("EgressT_co", covariant=True)


class EntryKind(IntEnum):
    """What a log entry is. Values are stored on disk: never renumber."""

    COMMAND = 1
    TIMER = 2
    CHECKPOINT = 3
    VERSION = 4  # the state-machine version in force from the next entry on


class ApplyContext:
    """Where in the log an entry sits and the consensus time of its batch.

    One instance is reused for a whole batch (the runtime moves `position`), so a
    state machine must copy the fields it wants to keep, never the context.
    """

    __slots__ = ("consensus_time_ms", "position")

    def __init__(self, position: int = 0, consensus_time_ms: int = 0) -> None:
        self.position = position
        self.consensus_time_ms = consensus_time_ms

    def __repr__(self) -> str:
        return f"ApplyContext(position={self.position}, consensus_time_ms={self.consensus_time_ms})"


class StateMachine(Protocol[EgressT_co]):
    """Validate, apply with the logged time, snapshot, restore, hash."""

    @property
    def version(self) -> int:
        """The state-machine version its decisions are made under now."""
        ...

    @property
    def implemented_versions(self) -> frozenset[int]:
        """Every version this build can decide under."""
        ...

    def activate_version(self, version: int) -> None:
        """Decide under `version` (implemented, higher than `version`) from now on."""
        ...

    def apply(self, command: bytes, context: ApplyContext) -> Sequence[EgressT_co]:
        """Apply one logged command. Bad input is answered in egress, never raised."""
        ...

    def on_timer(self, context: ApplyContext) -> Sequence[EgressT_co]:
        """A logged timer tick: the only way consensus time advances inside."""
        ...

    def snapshot(self) -> bytes:
        """Everything, including in-flight work, as of the last applied entry."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot taken by `snapshot`."""
        ...

    def state_hash(self) -> bytes:
        """A digest of the whole state; replicas at the same position must agree.

        Called every K entries on the apply path, so large machines keep it
        incremental instead of walking their state.
        """
        ...
