"""Where the matcher's open orders and the shard's index disagree, seen from outside.

The shard alone decides and heals (services/shard/core/reconcile.py); this is
only the reconciler's filter for which reports are worth logging. It names the
same cases the shard heals or flags: an order open in the shard that the
matcher does not hold (phantom), a PENDING order the matcher already rests
(lost acceptance), an order the matcher holds that the shard does not know or
holds with other remaining lots (impossible), and a reservation no open order
backs (leak).

A disagreement is only worth a report when it is stable: the same on both
sides at two looks a round apart (`group_fingerprint`). Orders and events in
transit explain every unstable one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2

GroupOf = Callable[[str], str | None]
MAX_LOOKS = 3  # looks at a suspect that keeps moving before it waits for the next pass


def group_drift(
    view: shard_pb2.ActorView,
    group: str,
    snapshot: matcher_pb2.OpenOrdersSnapshot,
    group_of: GroupOf,
) -> str | None:
    """Why the two sides disagree about the user's orders in `group`; None if they agree."""
    listed = {state.order.order_id: state for state in snapshot.orders}
    if not view.resident:
        return f"{next(iter(listed))} rests at the matcher, user not resident" if listed else None
    in_shard = {o.order_id: o for o in view.open_orders if group_of(o.symbol) == group}
    for order_id, order in in_shard.items():
        seen = listed.get(order_id)
        if order.status == common_pb2.ORDER_STATUS_PENDING:
            if seen is not None:
                return f"{order_id} pending in the shard, resting at the matcher"
            continue
        if seen is None:
            return f"{order_id} open in the shard, not at the matcher"
        if seen.remaining_lots != order.remaining_lots:
            return (
                f"{order_id} has {order.remaining_lots} lots left in the shard, "
                f"{seen.remaining_lots} at the matcher"
            )
    for order_id in listed:
        if order_id not in in_shard:
            return f"{order_id} rests at the matcher, unknown to the shard"
    return None


def leaked_reservation(view: shard_pb2.ActorView) -> str | None:
    """An asset whose reservations are not all backed by open orders; None if all are."""
    backed: Counter[str] = Counter()
    for order in view.open_orders:
        if order.reserved:
            backed[order.reserved_asset] += order.reserved
    for balance in view.state.balances:
        if balance.reserved != backed[balance.asset]:
            return f"{balance.asset}: {balance.reserved} reserved, {backed[balance.asset]} backed"
    return None


Fingerprint = tuple[object, ...]


def group_fingerprint(
    view: shard_pb2.ActorView,
    group: str,
    snapshot: matcher_pb2.OpenOrdersSnapshot,
    group_of: GroupOf,
) -> Fingerprint:
    """Both sides' state of the user's orders in `group`: equal fingerprints, nothing moved.

    The matcher's `as_of_sequence` is left out: it counts every user's events.
    """
    at_matcher = sorted(
        (state.order.order_id, state.status, state.remaining_lots, state.filled_lots)
        for state in snapshot.orders
    )
    in_shard = sorted(
        (o.order_id, o.status, o.remaining_lots, o.reserved, o.cancel_in_flight)
        for o in view.open_orders
        if group_of(o.symbol) == group
    )
    reserved = sorted((balance.asset, balance.reserved) for balance in view.state.balances)
    return (view.resident, tuple(at_matcher), tuple(in_shard), tuple(reserved))


@dataclass
class UserFinding:
    user_id: int
    snapshots: dict[str, matcher_pb2.OpenOrdersSnapshot]
    drift: dict[str, str] = field(default_factory=dict)  # group -> reason
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)  # group -> both sides
    looks: int = 1

    def reports(self, groups: Iterable[str]) -> list[shard_pb2.ShardCommand]:
        commands = []
        for group in groups:
            snapshot = self.snapshots[group]
            command = shard_pb2.ShardCommand()
            report = command.reconcile
            report.user_id = self.user_id
            report.matcher_group = group
            report.as_of_sequence = snapshot.as_of_sequence
            report.open_orders.extend(snapshot.orders)
            commands.append(command)
        return commands


def look(
    user_id: int,
    view: shard_pb2.ActorView,
    snapshots: Mapping[str, matcher_pb2.OpenOrdersSnapshot],
    group_of: GroupOf,
) -> UserFinding:
    """One look at a user: the shard's view against each matcher group's snapshot (read
    before the view: what a matcher lists is then in the shard's index or on its way out
    through an event emitted after the snapshot)."""
    finding = UserFinding(user_id, dict(snapshots))
    for group, snapshot in finding.snapshots.items():
        finding.fingerprints[group] = group_fingerprint(view, group, snapshot, group_of)
        reason = group_drift(view, group, snapshot, group_of)
        if reason is not None:
            finding.drift[group] = reason
    leak = leaked_reservation(view)
    if leak is not None and not finding.drift and finding.snapshots:
        # The shard releases unbacked reservations on any report of the user.
        finding.drift[next(iter(finding.snapshots))] = f"leaked reservation: {leak}"
    return finding


def stable_drift(first: UserFinding, second: UserFinding) -> dict[str, str]:
    """The groups that disagree at the second look, unchanged since the first."""
    return {
        group: reason
        for group, reason in second.drift.items()
        if first.fingerprints.get(group) == second.fingerprints[group]
    }
