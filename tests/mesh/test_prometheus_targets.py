"""The Prometheus targets `oms up` writes: one group per process, its replicated group
as `job`."""

from __future__ import annotations

import json
from pathlib import Path

from services.mesh.mesh_record import MeshRecord
from services.mesh.prometheus_targets import (
    TARGETS_NAME,
    job_of,
    scrape_targets,
    write_scrape_targets,
)


def test_replicas_share_their_groups_job_and_a_lone_process_is_its_own() -> None:
    assert job_of("shard-s1-r2") == "shard-s1"
    assert job_of("matcher-g1-r3") == "matcher-g1"
    assert job_of("shard-s1") == "shard-s1"
    assert job_of("persister-s2") == "persister-s2"
    assert job_of("gateway") == "gateway"


def test_the_file_is_prometheus_file_sd_in_name_order(tmp_path: Path) -> None:
    record = MeshRecord(
        gateway="127.0.0.1:1",
        shard="127.0.0.1:2",
        persister="127.0.0.1:3",
        bridge="127.0.0.1:4",
        reconciler="127.0.0.1:5",
        mesh_id="mesh-0123abcd",
        metrics={"shard-s1-r2": "127.0.0.1:9002", "gateway": "127.0.0.1:9000"},
    )
    path = write_scrape_targets(tmp_path, record)
    assert path == tmp_path / TARGETS_NAME
    assert json.loads(path.read_text()) == scrape_targets(record)
    assert scrape_targets(record) == [
        {
            "targets": ["127.0.0.1:9000"],
            "labels": {"job": "gateway", "process": "gateway", "mesh": "mesh-0123abcd"},
        },
        {
            "targets": ["127.0.0.1:9002"],
            "labels": {"job": "shard-s1", "process": "shard-s1-r2", "mesh": "mesh-0123abcd"},
        },
    ]
    assert not list(tmp_path.glob("*.tmp"))
