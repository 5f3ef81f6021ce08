"""Version 1's decisions, unchanged: logs that simulated leaders committed, replayed with
today's code, give the state hashes the leaders logged and the final hash recorded
(`tests/upgrade/golden_logs.py` says how they were made and when to make them again)."""

from __future__ import annotations

import zlib

import pytest

from services.markets.catalog import load_catalog
from services.runtime.core.replica import DivergenceError
from services.runtime.core.state_machine import EntryKind
from services.shard.core.balances import Funding
from services.shard.core.commands import Deposit, Withdraw
from services.shard.core.vocabulary import RejectReason
from tests.upgrade.golden_logs import FOLDER, GoldenLog, batches, read, replay

LOGS = read()


@pytest.mark.parametrize("log", LOGS, ids=[log.file for log in LOGS])
def test_a_golden_log_replays_to_its_leaders_hashes(log: GoldenLog) -> None:
    data = zlib.decompress((FOLDER / log.file).read_bytes())
    kinds = {kind for batch in batches(data) for kind, _ in batch.entries}
    assert int(EntryKind.CHECKPOINT) in kinds  # the leaders' hashes are in it
    replica = replay(log.kind, log.group, data, load_catalog().markets)
    assert replica.applied_position == log.last_position
    assert replica.checkpoints_verified > 0
    assert replica.machine.version == 1
    assert replica.machine.state_hash().hex() == log.final_hash


def test_every_group_of_the_run_has_its_golden_log() -> None:
    assert {(log.kind, log.group) for log in LOGS} == {
        ("shard", "s1"),
        ("shard", "s2"),
        ("shard", "s3"),
        ("matcher", "g1"),
        ("matcher", "g2"),
    }


def test_a_rule_changed_without_a_version_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted control: large deposits refused at version 1 (as if written without
    a new version) make the replay part from the leader's hash at a checkpoint."""
    original = Funding.transfer_problem

    def stricter(self: Funding, command: Deposit | Withdraw) -> int:
        if command.amount > 5_000_000_000:
            return int(RejectReason.INVALID_AMOUNT)
        return original(self, command)

    monkeypatch.setattr(Funding, "transfer_problem", stricter)
    log = next(log for log in LOGS if log.group == "s1")
    data = zlib.decompress((FOLDER / log.file).read_bytes())
    with pytest.raises(DivergenceError):
        replay(log.kind, log.group, data, load_catalog().markets)
