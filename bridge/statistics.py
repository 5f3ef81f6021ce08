"""What the bridge counts; `oms.v1.Status/GetStatus` and the metrics read the same numbers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields


@dataclass
class BridgeCounters:
    submits_forwarded: int = 0  # SubmitOrder commands written to a matcher stream
    cancels_forwarded: int = 0
    redriven: int = 0  # sagas re-sent from a GetInFlight snapshot
    matcher_duplicates: int = 0  # re-drives the matcher absorbed (known order id)
    cancels_not_found: int = 0  # cancels the matcher did not know (the submit comes next)
    events_delivered: int = 0  # matcher events handed to the shard
    reconnects: int = 0  # shard sessions and matcher connections re-established
    sequence_out_of_range: int = 0  # resumes past events the matcher no longer retains
    events_skipped: int = 0  # events lost to those resumes (the reconciler heals them)
    shed_while_down: int = 0  # egress items for a disconnected group (re-driven later)
    unroutable: int = 0  # egress naming a matcher group with no address
    traced_submits: int = 0  # sampled submits sent on an Execute call of their own
    traced_batched: int = 0  # sampled submits sent in a batch: too many traced calls in flight
    cancels_held: int = 0  # cancels that waited for their order's traced call to be answered
    marks_received: int = 0  # last prices read from the matchers' StreamLastPrices
    marks_published: int = 0  # prices written to the shard's PublishMarks (conflated)


@dataclass
class BridgeStatistics:
    counters: BridgeCounters = field(default_factory=BridgeCounters)
    # matcher group -> last sequence handed to the shard
    last_delivered: dict[str, int] = field(default_factory=dict)
    connected: dict[str, bool] = field(default_factory=dict)

    def status(self, shard_id: str, shard_address: str) -> tuple[Mapping[str, int], dict[str, str]]:
        counters = {f.name: int(getattr(self.counters, f.name)) for f in fields(self.counters)}
        info = {"shard_id": shard_id, "shard_address": shard_address}
        for group, sequence in sorted(self.last_delivered.items()):
            info[f"last_delivered_sequence.{group}"] = str(sequence)
        for group, up in sorted(self.connected.items()):
            info[f"connected.{group}"] = "yes" if up else "no"
        return counters, info
