"""`oms status`'s rows from reports: lag behind the leader, the hash check, the
persister's watermark, and a process that did not answer."""

from __future__ import annotations

from services.mesh.status_rows import ProcessReport, ProcessTarget, render_table, rows_of


def _replica(
    index: int,
    *,
    leading: bool,
    applied: int,
    time_ms: int,
    state_hash: str,
    checkpoints: str = "",
    group: str = "s1",
) -> ProcessReport:
    return ProcessReport(
        ProcessTarget("shard", group, index, f"127.0.0.1:{7000 + index}"),
        {
            "leading": int(leading),
            "term": 4,
            "applied_position": applied,
            "durable_position": applied,
            "consensus_time_ms": time_ms,
            "shard.resident_users": 12,
            "shard.in_flight_sagas": 3,
            "uptime_s": 95,
        },
        {"state_hash": state_hash, "checkpoints": checkpoints},
    )


def test_a_follower_shows_its_lag_and_agrees_where_positions_meet() -> None:
    leader = _replica(
        0, leading=True, applied=1_500, time_ms=9_000, state_hash="aa", checkpoints="1000:c1"
    )
    behind = _replica(
        1, leading=False, applied=1_200, time_ms=8_250, state_hash="bb", checkpoints="1000:c1"
    )
    rows = rows_of([leader, behind])
    assert (rows[0].role, rows[0].lag_entries, rows[0].lag_ms) == ("leader", 0, 0)
    assert (rows[1].role, rows[1].lag_entries, rows[1].lag_ms) == ("follower", 300, 750)
    assert [row.hash_check for row in rows] == ["ok", "ok"]
    assert all(row.health == "ok" for row in rows)
    assert (rows[1].resident_users, rows[1].sagas_in_flight, rows[1].uptime_s) == (12, 3, 95)


def test_replicas_with_different_hashes_at_one_position_are_flagged() -> None:
    leader = _replica(0, leading=True, applied=1_500, time_ms=9_000, state_hash="aa")
    same_place = _replica(1, leading=False, applied=1_500, time_ms=9_000, state_hash="ab")
    checkpoint = _replica(
        2, leading=False, applied=900, time_ms=1, state_hash="x", checkpoints="1500:ab"
    )
    rows = rows_of([leader, same_place, checkpoint])
    assert rows[1].hash_check == "MISMATCH at 1500" and rows[1].health == "DIVERGED"
    assert rows[2].hash_check == "MISMATCH at 1500"
    assert rows[0].health == "ok"


def test_a_missing_process_is_a_row_saying_why_and_the_persister_shows_its_watermark() -> None:
    leader = _replica(0, leading=True, applied=2_000, time_ms=5, state_hash="aa")
    gone = ProcessReport(
        ProcessTarget("shard", "s1", 1, "127.0.0.1:7001"), failure="no answer: UNAVAILABLE"
    )
    persister = ProcessReport(
        ProcessTarget("persister", "s1", 0, "127.0.0.1:7100"),
        {"committed_position": 1_950, "leading": 1, "term": 2},
        {"role": "active"},
    )
    rows = rows_of([leader, gone, persister])
    assert (rows[1].role, rows[1].health, rows[1].applied_position) == (
        "",
        "no answer: UNAVAILABLE",
        None,
    )
    assert (rows[2].role, rows[2].written_through, rows[2].lag_entries) == ("active", 1_950, 50)
    table = render_table(rows).splitlines()
    assert table[0].split()[:3] == ["SERVICE", "GROUP", "#"]
    assert "no answer: UNAVAILABLE" in table[2] and "1,950" in table[3]
