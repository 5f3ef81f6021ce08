"""Which snapshots a replica keeps, and which one a restart replays from.

A replica's egress window (`egress_feed.py`) starts after the snapshot it recovered
from: egress before that was computed by an earlier process and is gone with it. A
consumer that must not skip anything (the persister writes every row of the log to
PostgreSQL) resumes after its own cursor, so a replica that restarted from a snapshot
newer than that cursor, then led, could never give it the rows in between: the
persister stopped for good (EgressGapError; `oms sim --seed 80` found it, with
PostgreSQL down long enough for a snapshot to pass the cursor).

The state machine knows the cursor as of each log position (the persister logs it:
the shard's `Persisted` command), and calls it the egress floor. So:

- besides the newest `retained` snapshots, a replica keeps the newest one at or
  before its egress floor, and the log after it (after the log's start when there is
  none: the empty state is the snapshot then);
- a restart replays from the newest snapshot as usual; if the floor it then knows is
  still before that snapshot, it replays again from the newest one at or before the
  floor, so its egress covers everything after the persister's cursor.

When the persister keeps up, the floor is past the newest snapshot within a second
of it being taken: nothing extra is kept and a restart replays once.
"""

from __future__ import annotations

from collections.abc import Sequence

EMPTY_STATE = 0  # the state before the log's first entry: "a snapshot" at position 0


def snapshots_to_keep(
    positions: Sequence[int], retained: int, egress_floor: int | None
) -> list[int]:
    """Of `positions` (ascending), those to keep: the `retained` newest, and the newest
    at or before `egress_floor` (None: no consumer needs one)."""
    if retained < 1:
        raise ValueError("retained must be at least 1")
    newest = list(positions[-retained:])
    held = None if egress_floor is None else floor_snapshot(positions, egress_floor)
    if held is not None and held not in newest:
        return [held, *newest]
    return newest


def floor_snapshot(positions: Sequence[int], egress_floor: int) -> int | None:
    """The newest of `positions` (ascending) at or before `egress_floor`, if any."""
    found = None
    for position in positions:
        if position > egress_floor:
            break
        found = position
    return found


def log_needed_after(kept: Sequence[int], egress_floor: int | None) -> int:
    """The log position the log must be kept after, given the snapshots `kept`
    (ascending): the oldest of them, or the start of the log (the empty state) when
    none is at or before the egress floor."""
    if egress_floor is not None and floor_snapshot(kept, egress_floor) is None:
        return EMPTY_STATE
    return kept[0] if kept else EMPTY_STATE


def replay_again_from(
    recovered_from: int, egress_floor: int, positions: Sequence[int], log_first_position: int
) -> int | None:
    """After replaying from the snapshot at `recovered_from` to the log's end, where the
    egress floor is `egress_floor`: the older snapshot (of `positions`, ascending, the
    valid ones; EMPTY_STATE for the log's start) to replay from again, or None when the
    egress already covers the floor or nothing older can help (no snapshot old enough,
    or the log no longer reaches back to it)."""
    if egress_floor >= recovered_from:
        return None
    older = floor_snapshot(positions, egress_floor)
    if older is None:
        older = EMPTY_STATE
    if older >= recovered_from or log_first_position > older + 1:
        return None
    return older
