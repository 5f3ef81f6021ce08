"""A local mesh's Prometheus targets: `state_dir/prometheus-targets.json`.

`oms up` writes it beside `mesh.json`, in the format of Prometheus' `file_sd_configs`
(a list of groups, each with `targets` and `labels`), so one scrape job pointed at the
file scrapes every process and follows the mesh when a port changes (Prometheus
rereads the file itself). Each process's group sets:

- `job`: the replicated group it belongs to, the unit the alert rules aggregate by (with `mesh`)
  (`OmsNoReplicaLeading` sums `oms_leading` by job, `OmsReplicaLagging` compares a
  replica with its job's furthest): `shard-s1-r2` is in job `shard-s1`, `matcher-btc-r3`
  in `matcher-btc`; a process without replicas is a job of its own;
- `process`: the name `oms up` gave it (`shard-s1-r2`), as in its log lines;
- `mesh`: the mesh's id, so meshes sharing a Prometheus stay apart.

A target label named `job` takes the place of the scrape job's name (Prometheus sets
`job` only where a target has none). Pure: a record in, groups out.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from services.mesh.mesh_record import MeshRecord

TARGETS_NAME = "prometheus-targets.json"
_REPLICA_SUFFIX = re.compile(r"-r[0-9]+$")


def job_of(process: str) -> str:
    """The replicated group of a process named by `oms up`."""
    return _REPLICA_SUFFIX.sub("", process)


def scrape_targets(record: MeshRecord) -> list[dict[str, Any]]:
    """One `file_sd_configs` group per process, in name order."""
    return [
        {
            "targets": [record.metrics[process]],
            "labels": {"job": job_of(process), "process": process, "mesh": record.mesh_id},
        }
        for process in sorted(record.metrics)
    ]


def write_scrape_targets(state_dir: Path, record: MeshRecord) -> Path:
    """Write the targets file whole (renamed into place: Prometheus never reads half)."""
    path = state_dir / TARGETS_NAME
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(scrape_targets(record), indent=2) + "\n")
    os.replace(temporary, path)
    return path
