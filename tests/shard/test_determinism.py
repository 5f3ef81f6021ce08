"""The same log gives the same state in every process, whatever PYTHONHASHSEED is.

String hashing is salted per process: a state machine that iterated a set of
strings or used `hash()` would diverge between replicas. Two child processes
with different seeds replay one scripted log (bytes path, timers included) and
must print the same state hash and the same snapshot digest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from services.runtime.core.state_machine import ApplyContext
from services.shard.core.codec import encode_command_batch
from services.shard.core.commands import Command
from services.shard.core.shard_machine import ShardMachine
from services.shard.core.vocabulary import EventKind
from tests.shard.support import TTL_MS, ShardDriver

ROOT = Path(__file__).resolve().parents[2]


def scripted_log() -> list[bytes | int]:
    """Command batches (bytes) and timer ticks (advance in ms), in log order."""
    driver = ShardDriver()
    log: list[bytes | int] = []
    users = [f"u{n}" for n in range(6)]
    batch = [driver.hydrate(n + 1, balances={"USDT": 10**6, "BTC": 10**5}) for n in range(6)]
    log.append(encode_command_batch(batch))
    for round_number in range(4):
        commands: list[Command] = []
        for n, name in enumerate(users):
            commands.append(driver.place(n + 1, f"{name}-{round_number}", price_ticks=90 + n))
            commands.append(driver.deposit(n + 1, "USDT", 10 + n, f"{name}-t{round_number}"))
        log.append(encode_command_batch(commands))
        events = [
            driver.event("g1", EventKind.ACCEPTED, f"s1:{n + 1}:{round_number + 1}", n + 1)
            for n in range(6)
        ]
        log.append(encode_command_batch([driver.events("g1", *events)]))
        fills = [
            driver.fill(
                f"s1:{n + 1}:{round_number + 1}", n + 1, price_ticks=90, quantity_lots=1, done=True
            )
            for n in range(0, 6, 2)
        ]
        log.append(encode_command_batch([driver.events("g1", *fills), driver.marks(BTC_USDT=95)]))
        log.append(TTL_MS // 3)
    log.append(TTL_MS * 2)
    return log


def replay(log: list[bytes | int]) -> tuple[str, str]:
    machine = replayed_machine(log)
    snapshot_digest = hashlib.blake2b(machine.snapshot(), digest_size=16).hexdigest()
    return machine.state_hash().hex(), snapshot_digest


def replayed_machine(log: list[bytes | int]) -> ShardMachine:
    machine = ShardMachine(ShardDriver().settings)
    now = 10_000_000
    for position, entry in enumerate(log, start=1):
        if isinstance(entry, int):
            now += entry
            machine.on_timer(ApplyContext(position, now))
        else:
            machine.apply(entry, ApplyContext(position, now))
        machine.check_invariants()
    return machine


def test_replays_agree_across_hash_seeds() -> None:
    outputs = []
    for seed in ("1", "2"):
        environment = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        completed = subprocess.run(
            [sys.executable, "-c", "from tests.shard.test_determinism import main; main()"],
            capture_output=True,
            text=True,
            env=environment,
            cwd=ROOT,
            timeout=120,
            check=True,
        )
        outputs.append(completed.stdout.strip())
    assert outputs[0] == outputs[1]
    assert outputs[0] == " ".join(replay(scripted_log()))


def test_the_script_exercises_fills_marks_and_evictions() -> None:
    statistics = replayed_machine(scripted_log()).statistics()
    assert statistics.counter("fills_settled") == 12
    assert statistics.counter("orders_accepted") == 24
    # Half the users still hold resting orders: only the flat half is dehydrating.
    assert statistics.counter("evictions_started") == 3
    assert statistics.dehydrating_users == 3


def main() -> None:
    print(" ".join(replay(scripted_log())))
