"""`oms status` and `omsctl` against `oms up --replicas 3` as a developer runs it (TLS
everywhere), with no flag but the state folder: every process is a row, one leader
per group, equal terms and agreeing hashes; a follower stopped shows as not
answering, within the deadline, and once killed and restarted by the supervisor, is
back as a follower; `--etcd` finds the same replicated groups through the replica
registry and leader keys; `oms client admin` finds the gateway and the admin key;
`omsctl residents` with every shard replica stopped says it waits for a leader, and
answers once they run again and one is elected."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.mesh.up_process import ROOT
from tests.replication.replicated_mesh import ReplicatedMesh

STATUS_TIMEOUT_S = 1.0
CHANGE_TIMEOUT_S = 60.0

Rows = list[dict[str, Any]]


def oms_status(environment: dict[str, str], *arguments: str) -> tuple[int, Rows]:
    done = subprocess.run(
        [sys.executable, "-m", "services.command_line", "status", "--json", *arguments],
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    rows: Rows = json.loads(done.stdout)
    return done.returncode, rows


def settled(rows: Rows) -> bool:
    """One leader per replicated group, and its term on every replica of the group."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["service"] in ("shard", "matcher"):
            groups.setdefault((row["service"], row["group"]), []).append(row)
    return all(
        sum(r["role"] == "leader" for r in replicas) == 1
        and len({r["term"] for r in replicas}) == 1
        for replicas in groups.values()
    )


def row_of(rows: Rows, service: str, address: str) -> dict[str, Any]:
    return next(r for r in rows if r["service"] == service and r["address"] == address)


def wait_for_row(
    environment: dict[str, str], state_dir: Path, service: str, address: str, wanted: Any
) -> dict[str, Any]:
    deadline = time.monotonic() + CHANGE_TIMEOUT_S
    while True:
        _, rows = oms_status(
            environment, "--state-dir", str(state_dir), "--timeout-s", str(STATUS_TIMEOUT_S)
        )
        row = row_of(rows, service, address)
        if wanted(row):
            return row
        assert time.monotonic() < deadline, row


@pytest.mark.slow
def test_oms_status_shows_every_process_a_stopped_follower_and_its_return(
    tmp_path: Path, database_url: str
) -> None:
    state_dir = tmp_path / "state"
    with ReplicatedMesh(state_dir, database_url, tls=True) as mesh:
        environment = mesh.environment
        record = mesh.record
        # Until every replica has joined its group, the leaders are elected and every
        # follower has seen its leader's term.
        deadline = time.monotonic() + CHANGE_TIMEOUT_S
        while True:
            code, rows = oms_status(environment, "--state-dir", str(state_dir))
            if code == 0 and settled(rows):
                break
            assert time.monotonic() < deadline, rows
        services = sorted({(r["service"], r["group"]) for r in rows})
        assert services == sorted(
            [("gateway", ""), ("shard", "s1"), ("persister", "s1"), ("bridge", "s1")]
            + [("reconciler", "s1")]
            + [("matcher", group) for group in record.matchers]
        )
        shards = [r for r in rows if r["service"] == "shard"]
        assert len(shards) == 3 and shards[0]["term"] > 0, shards
        assert all(r["health"] == "ok" and r["hash_check"] in ("ok", "") for r in rows), rows
        assert all(r["uptime_s"] is not None for r in rows), rows
        for replica in (r for r in rows if r["role"] == "follower"):
            assert 0 <= replica["lag_entries"] < 1_000 and replica["lag_ms"] >= 0, replica
        leader = next(r for r in shards if r["role"] == "leader")
        assert leader["resident_users"] is not None and leader["sagas_in_flight"] is not None

        follower = next(r["address"] for r in shards if r["role"] == "follower")
        subprocess.run(["pkill", "-STOP", "-f", f"listen {follower}"], check=True)
        try:
            started = time.monotonic()
            gone = wait_for_row(
                environment, state_dir, "shard", follower, lambda r: r["role"] == ""
            )
            assert gone["health"].startswith("no answer"), gone
            assert time.monotonic() - started < 30, "the table waited on the stopped process"
        finally:
            subprocess.run(["pkill", "-KILL", "-f", f"listen {follower}"], check=False)
        back = wait_for_row(
            environment, state_dir, "shard", follower, lambda r: r["role"] == "follower"
        )
        assert back["uptime_s"] < CHANGE_TIMEOUT_S, back

        # As for a deployed mesh: the groups found in etcd (with the folder's tools
        # identity and its etcd), the same replicas.
        _, found = oms_status(environment, "--etcd", "--state-dir", str(state_dir))
        replicas = sorted(r["address"] for r in found if r["service"] == "shard")
        assert replicas == sorted(record.shard_replicas()), found
        assert {r["service"] for r in found} == {
            "shard",
            "matcher",
            "persister",
            "bridge",
            "reconciler",
        }, found
        assert all(r["health"] == "ok" for r in found), found

        # `oms client admin` with the folder alone: its gateway, authority and admin key.
        client = [sys.executable, "-m", "services.command_line", "client"]
        users = subprocess.run(
            [*client, "--state-dir", str(state_dir), "admin", "users"],
            check=False,
            capture_output=True,
            text=True,
            env=environment,
            cwd=ROOT,
            timeout=CHANGE_TIMEOUT_S,
        )
        assert users.returncode == 0, users.stdout + users.stderr

        omsctl = [sys.executable, "-m", "services.routing.omsctl", "--state-dir", str(state_dir)]
        shown = subprocess.run(
            [*omsctl, "residents", "s1"],
            check=False,
            capture_output=True,
            text=True,
            env=environment,
            cwd=ROOT,
            timeout=CHANGE_TIMEOUT_S,
        )
        assert shown.returncode == 0 and "s1" in shown.stdout, shown.stdout + shown.stderr
        for address in record.shard_replicas():
            subprocess.run(["pkill", "-STOP", "-f", f"listen {address}"], check=True)
        waiting = subprocess.Popen(
            [*omsctl, "residents", "s1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            cwd=ROOT,
        )
        try:
            assert waiting.stderr is not None
            readable, _, _ = select.select([waiting.stderr], [], [], CHANGE_TIMEOUT_S)
            said = waiting.stderr.readline() if readable else ""
        finally:
            for address in record.shard_replicas():
                subprocess.run(["pkill", "-CONT", "-f", f"listen {address}"], check=False)
        output, errors = waiting.communicate(timeout=CHANGE_TIMEOUT_S)
        assert "waiting for a leader of s1" in said, said + errors
        assert waiting.returncode == 0 and "s1" in output, output + errors
