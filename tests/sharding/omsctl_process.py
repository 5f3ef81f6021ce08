"""`omsctl` as an operator runs it against a test's sharded mesh: a process of its own."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.sharded_mesh import ShardedMesh

ROOT = Path(__file__).resolve().parents[2]
OMSCTL_TIMEOUT_S = 120.0


def omsctl_command(mesh: ShardedMesh, *arguments: str) -> list[str]:
    shards = ",".join(f"{c}={p.shard.address}" for c, p in mesh.clusters.items())
    return [
        sys.executable,
        "-m",
        "services.routing.omsctl",
        "--etcd",
        ",".join(mesh.etcd_endpoints),
        "--mesh",
        mesh.mesh_id,
        "--shards",
        shards,
        *arguments,
    ]


async def start_omsctl(mesh: ShardedMesh, *arguments: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *omsctl_command(mesh, *arguments),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def kill_at(process: asyncio.subprocess.Process, marker: str, occurrence: int) -> list[str]:
    """SIGKILL `process` as soon as it prints `marker` for the `occurrence`th time; its
    lines until then."""
    assert process.stdout is not None
    lines: list[str] = []
    seen = 0
    async with asyncio.timeout(OMSCTL_TIMEOUT_S):
        while seen < occurrence:
            raw = await process.stdout.readline()
            assert raw, f"omsctl ended before its wave {occurrence}: {lines}"
            lines.append(raw.decode().rstrip())
            seen += marker in lines[-1]
    process.kill()
    await process.wait()
    return lines


async def run_to_the_end(process: asyncio.subprocess.Process) -> Sequence[str]:
    async with asyncio.timeout(OMSCTL_TIMEOUT_S):
        output, _ = await process.communicate()
    lines = output.decode().splitlines()
    assert process.returncode == 0, lines
    return lines
