"""A local mesh as the tools find it: the state folder `oms up` keeps.

`mesh.json` names the processes, the mesh id and whether the links are TLS;
`infra.json` the embedded etcd. A tool that reads them reaches the mesh as the local
operator (`adopt`: the development authority's `operator` certificate, which etcd
also takes as its user), so `omsctl` and `oms status` need no flags against
`make run`'s mesh. The folder is `--state-dir`, else `OMS_STATE_DIR`, else `state/`;
flags and a pod's `OMS_*` environment override what the folder says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from services.infra.infra_record import read_record
from services.infra.local_infra import LocalInfra
from services.infra.settings import DEFAULT_STATE_DIR
from services.mesh.mesh_record import MeshRecord, read_mesh_record
from services.transport.development import adopt_mesh_transports


def state_dir_of(given: Path | None) -> Path:
    return given or Path(os.environ.get("OMS_STATE_DIR", DEFAULT_STATE_DIR))


@dataclass(frozen=True)
class LocalMesh:
    state_dir: Path
    record: MeshRecord
    etcd_endpoints: tuple[str, ...]  # () when the folder's etcd is not recorded
    database_url: str = ""  # the embedded PostgreSQL's; "" when the mesh uses another

    @classmethod
    def find(cls, state_dir: Path) -> LocalMesh | None:
        """The mesh `oms up` recorded under `state_dir`, or None."""
        record = read_mesh_record(state_dir)
        if record is None:
            return None
        infra = read_record(LocalInfra(state_dir).state_file)
        etcd, postgres = infra.etcd, infra.postgres
        return cls(
            state_dir,
            record,
            (etcd.endpoint,) if etcd is not None else (),
            postgres.url if postgres is not None else "",
        )

    def adopt(self) -> None:
        """This process reaches the mesh (and its etcd) as the local operator."""
        adopt_mesh_transports(self.state_dir, tls=self.record.tls)
