"""`oms status`'s table: a row per process, from what each one's `oms.v1.Status` said.

Pure: the probing is `status_probe.py`'s, the finding of processes
`status_targets.py`'s. What a row derives from its group rather than from its own
report:
- a replica's lag: its leader's applied position minus its own (entries), and its
  leader's consensus time minus its own (ms: how old the state it serves is, in the
  log's own clock);
- the state hash check: replicas of one group that report a hash at the same log
  position (their applied position, or a checkpoint both recorded) must agree; a
  replica that disagrees with its group's leader (or, leaderless, with the group's
  first replica) is flagged MISMATCH: it computed a different state from the same log;
- a persister's lag: its shard leader's applied position minus the position it has
  written through.
A process that did not answer is a row too, with why (`health`), never left out;
but in a co-located replicated cluster (`oms up --replicas 3 --colocate`) a persister
beside a follower shard replica listens only once that replica leads: when the
replica (its own process) answers as a follower, the persister is a standby, healthy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

HASH_PREFIX = 12  # hex digits shown; the JSON has the whole hash
REPLICATED = ("shard", "matcher")  # the replicated state machines: hashes, terms, lag


@dataclass(frozen=True, slots=True)
class ProcessTarget:
    service: str  # gateway, shard, matcher, persister, bridge, reconciler
    group: str  # the shard cluster or matcher group ("" for the gateway)
    replica: int  # 0-based within its group and service (the record's order)
    address: str


@dataclass(frozen=True, slots=True)
class ProcessReport:
    """One probe's outcome: the report's counters and info, or why there is none."""

    target: ProcessTarget
    counters: Mapping[str, int] = field(default_factory=dict)
    info: Mapping[str, str] = field(default_factory=dict)
    failure: str = ""  # "" when it answered

    @property
    def answered(self) -> bool:
        return not self.failure


@dataclass(frozen=True, slots=True)
class StatusRow:
    service: str
    group: str
    replica: int
    address: str
    role: str  # leader, follower, active, standby, serving; "" when it did not answer
    term: int | None
    applied_position: int | None
    durable_position: int | None
    lag_entries: int | None
    lag_ms: int | None
    state_hash: str
    hash_check: str  # "ok", "MISMATCH at <position>", or "" when nothing to compare
    resident_users: int | None
    sagas_in_flight: int | None
    written_through: int | None  # a persister's write-behind watermark
    health: str  # "ok", or what is wrong ("no answer within 1.0 s", "lease uncertain")
    uptime_s: int | None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def rows_of(reports: Sequence[ProcessReport], colocated: bool = False) -> list[StatusRow]:
    """The table's rows, in the reports' order. `colocated`: each shard replica's process
    runs its cluster's persister, bridge and reconciler (the same replica index)."""
    leaders = _leaders(reports)
    rows = [_row(report, leaders, reports) for report in reports]
    if colocated:
        rows = [_standby_if_beside_a_follower(row, reports) for row in rows]
    return rows


def _standby_if_beside_a_follower(row: StatusRow, reports: Sequence[ProcessReport]) -> StatusRow:
    """A co-located persister that does not answer beside a shard replica that answers as
    a follower: a standby (it listens once its replica leads), alive with its process."""
    if row.service != "persister" or row.role:
        return row
    beside = next(
        (
            r
            for r in reports
            if r.target.service == "shard"
            and r.target.group == row.group
            and r.target.replica == row.replica
        ),
        None,
    )
    if beside is None or not beside.answered or beside.counters.get("leading"):
        return row
    return replace(row, role="standby", health="ok", uptime_s=beside.counters.get("uptime_s"))


def _key(target: ProcessTarget) -> tuple[str, str]:
    return target.service, target.group


def _leaders(reports: Sequence[ProcessReport]) -> dict[tuple[str, str], ProcessReport]:
    """Each replicated group's leader among the answers (the highest term, if two say so)."""
    leaders: dict[tuple[str, str], ProcessReport] = {}
    for report in reports:
        if report.target.service in REPLICATED and report.counters.get("leading"):
            known = leaders.get(_key(report.target))
            if known is None or report.counters.get("term", 0) > known.counters.get("term", 0):
                leaders[_key(report.target)] = report
    return leaders


def _checkpoints(report: ProcessReport) -> dict[int, str]:
    """The hashes a replica reports, by position: its checkpoints and its current one."""
    hashes: dict[int, str] = {}
    for item in report.info.get("checkpoints", "").split(","):
        position, _, digest = item.partition(":")
        if position.isdigit() and digest:
            hashes[int(position)] = digest
    applied = report.counters.get("applied_position")
    if applied is not None and report.info.get("state_hash"):
        hashes[applied] = report.info["state_hash"]
    return hashes


def _hash_check(
    report: ProcessReport,
    leaders: Mapping[tuple[str, str], ProcessReport],
    reports: Sequence[ProcessReport],
) -> str:
    reference = leaders.get(_key(report.target))
    if reference is None:  # leaderless: compare with the group's first that answered
        reference = next(
            (r for r in reports if _key(r.target) == _key(report.target) and r.answered), None
        )
    if reference is None or reference is report:
        return "ok" if _checkpoints(report) else ""
    mine, theirs = _checkpoints(report), _checkpoints(reference)
    common = sorted(set(mine) & set(theirs))
    for position in common:
        if mine[position] != theirs[position]:
            return f"MISMATCH at {position}"
    return "ok" if common else ""


def _row(
    report: ProcessReport,
    leaders: Mapping[tuple[str, str], ProcessReport],
    reports: Sequence[ProcessReport],
) -> StatusRow:
    target = report.target
    counters, info = report.counters, report.info
    if not report.answered:
        return StatusRow(
            target.service, target.group, target.replica, target.address, "", None, None,
            None, None, None, "", "", None, None, None, report.failure, None,
        )  # fmt: skip
    replicated = target.service in REPLICATED
    applied = counters.get("applied_position") if replicated else None
    lag_entries = lag_ms = None
    leader = leaders.get(_key(target))
    if replicated and leader is not None and applied is not None:
        lag_entries = max(0, leader.counters.get("applied_position", 0) - applied)
        lag_ms = max(
            0,
            leader.counters.get("consensus_time_ms", 0) - counters.get("consensus_time_ms", 0),
        )
    written = counters.get("committed_position") if target.service == "persister" else None
    shard_leader = leaders.get(("shard", target.group))
    if written is not None and shard_leader is not None:
        lag_entries = max(0, shard_leader.counters.get("applied_position", 0) - written)
    health = "ok"
    if counters.get("lease_uncertain"):
        health = "lease uncertain"
    hash_check = _hash_check(report, leaders, reports) if replicated else ""
    if hash_check.startswith("MISMATCH"):
        health = "DIVERGED"
    return StatusRow(
        service=target.service,
        group=target.group,
        replica=target.replica,
        address=target.address,
        role=_role(report),
        # A follower's own `term` is 0 (it won none): the group's is its leader's.
        term=counters.get("leader_term", counters.get("term")),
        applied_position=applied,
        durable_position=counters.get("durable_position") if replicated else None,
        lag_entries=lag_entries,
        lag_ms=lag_ms,
        state_hash=info.get("state_hash", "") if replicated else "",
        hash_check=hash_check,
        resident_users=counters.get("shard.resident_users"),
        sagas_in_flight=counters.get("shard.in_flight_sagas"),
        written_through=written,
        health=health,
        uptime_s=counters.get("uptime_s"),
    )


def _role(report: ProcessReport) -> str:
    if report.target.service in REPLICATED:
        return "leader" if report.counters.get("leading") else "follower"
    return report.info.get("role", "serving")  # a leader-only role: active or standby


COLUMNS = (
    ("SERVICE", "service"),
    ("GROUP", "group"),
    ("#", "replica"),
    ("ADDRESS", "address"),
    ("ROLE", "role"),
    ("TERM", "term"),
    ("APPLIED", "applied_position"),
    ("DURABLE", "durable_position"),
    ("LAG", "lag_entries"),
    ("LAG MS", "lag_ms"),
    ("HASH", "state_hash"),
    ("HASHES", "hash_check"),
    ("USERS", "resident_users"),
    ("SAGAS", "sagas_in_flight"),
    ("WRITTEN", "written_through"),
    ("UPTIME", "uptime_s"),
    ("HEALTH", "health"),
)


def render_table(rows: Sequence[StatusRow]) -> str:
    """Aligned columns; "-" where a number does not apply or is not known."""
    cells = [[title for title, _ in COLUMNS]]
    for row in rows:
        cells.append([_cell(name, getattr(row, name)) for _, name in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


def _cell(name: str, value: object) -> str:
    if value is None or value == "":
        return "-"
    if name == "state_hash":
        return str(value)[:HASH_PREFIX]
    if name == "uptime_s" and isinstance(value, int):
        return _duration(value)
    if isinstance(value, int) and name != "replica":
        return f"{value:,}" if name != "term" else str(value)
    return str(value)


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7_200:
        return f"{seconds // 60}m"
    return f"{seconds // 3_600}h{seconds % 3_600 // 60:02d}m"
