"""`oms status` and `omsctl` against `oms up --replicas 3` as a developer runs it (TLS
everywhere), with no flag but the state folder: every process is a row, one leader
per group, equal terms and agreeing hashes; a follower stopped shows as not
answering, within the deadline, and once killed and restarted by the supervisor, is
back as a follower; `--etcd` finds the same replicated groups through the replica
registry and leader keys; `oms client` finds the gateway, its authority and the admin
key; with every shard replica stopped, `omsctl residents`, `oms client orders` and
`oms client admin halt` say they wait, and answer once the leader is killed and the
followers, running again, elect a new one."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from services.infra.ports import free_port
from tests.mesh.up_process import ROOT, run_demo
from tests.replication.replicated_mesh import ReplicatedMesh

STATUS_TIMEOUT_S = 1.0
CHANGE_TIMEOUT_S = 60.0

Rows = list[dict[str, Any]]


def oms_status(environment: dict[str, str], *arguments: str) -> tuple[int, Rows]:
    command = [sys.executable, "-m", "services.command_line", "status", "--json", *arguments]
    code, output = run(environment, command, codes=(0, 1))
    rows: Rows = json.loads(output)
    return code, rows


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
            [("gateway", ""), ("marketdata", ""), ("shard", "s1"), ("persister", "s1")]
            + [("bridge", "s1")]
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

        # `oms client` with the folder alone: its gateway, authority and admin key.
        client = [sys.executable, "-m", "services.command_line", "client"]
        client += ["--state-dir", str(state_dir)]
        run_demo(state_dir, environment)  # users 1 and 2
        _, created = run(environment, [*client, "--user-id", "1", "keys", "create"])
        api_key = created.split()[0]
        api_secret = created.split("secret (shown once): ")[1].split()[0]
        assert run(environment, [*client, "admin", "users"])[1]
        # `=`: a secret may begin with "-", which argparse would take for an option.
        user = [*client, "--user-id", "1", "--api-key", api_key, f"--api-secret={api_secret}"]
        omsctl = [sys.executable, "-m", "services.routing.omsctl", "--state-dir", str(state_dir)]
        assert "s1" in run(environment, [*omsctl, "residents", "s1"])[1]

        # Every shard replica stopped: no leader to answer, and the tools say they wait.
        # Then the leader is killed and the followers run again: they elect a new one
        # (the supervisor restarts the killed one), and the tools answer.
        _, rows = oms_status(environment, "--state-dir", str(state_dir))
        old = next(r for r in rows if r["service"] == "shard" and r["role"] == "leader")
        for address in record.shard_replicas():
            subprocess.run(["pkill", "-STOP", "-f", f"listen {address}"], check=True)
        waiting = [start_tool(environment, [*omsctl, "residents", "s1"])]
        waiting.append(start_tool(environment, [*user, "orders"]))
        waiting.append(start_tool(environment, [*client, "admin", "halt", "2", "--note", "t"]))
        try:
            said = [first_error_line(process) for process in waiting]
        finally:
            subprocess.run(["pkill", "-KILL", "-f", f"listen {old['address']}"], check=False)
            for address in record.shard_replicas():
                subprocess.run(["pkill", "-CONT", "-f", f"listen {address}"], check=False)
        ended = [process.communicate(timeout=CHANGE_TIMEOUT_S) for process in waiting]
        assert "waiting for a leader of s1" in said[0], (said, ended)
        assert said[1].startswith("oms client: waiting"), (said, ended)
        assert said[2].startswith("oms client admin: waiting"), (said, ended)
        assert [process.returncode for process in waiting] == [0, 0, 0], (said, ended)
        assert "s1" in ended[0][0], ended
        _, rows = oms_status(environment, "--state-dir", str(state_dir))
        new = [r for r in rows if r["service"] == "shard" and r["role"] == "leader"]
        assert new and new[0]["term"] > old["term"], (old, new)


def run(
    environment: dict[str, str], command: list[str], codes: tuple[int, ...] = (0,)
) -> tuple[int, str]:
    """The command's exit status (one of `codes`) and what it printed."""
    done = subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=CHANGE_TIMEOUT_S,
    )
    assert done.returncode in codes, done.stdout + done.stderr
    return done.returncode, done.stdout


def start_tool(environment: dict[str, str], command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        cwd=ROOT,
    )


def first_error_line(process: subprocess.Popen[str]) -> str:
    """The process's first line on stderr, waited for within the test's deadline."""
    assert process.stderr is not None
    readable, _, _ = select.select([process.stderr], [], [], CHANGE_TIMEOUT_S)
    return process.stderr.readline() if readable else ""


def test_oms_status_says_when_etcd_does_not_answer(tmp_path: Path) -> None:
    """No etcd where `--etcd` points: one line saying so, exit 1, no traceback."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("OMS_ETCD_ENDPOINTS", None)
    command = [sys.executable, "-m", "services.command_line", "status", "--state-dir"]
    command += [str(tmp_path), "--etcd", f"127.0.0.1:{free_port()}", "--mesh-id", "nobody"]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, env=environment, cwd=ROOT,
        timeout=CHANGE_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "etcd did not answer" in done.stderr and "Traceback" not in done.stderr
