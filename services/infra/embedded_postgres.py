"""A PostgreSQL server on 127.0.0.1, run from the binaries shipped by the `pgserver` package.

We drive `initdb` and `postgres` ourselves instead of pgserver's `get_server()`: that one
listens on a unix socket only and stops the server from an atexit hook, while we need TCP
and servers that outlive the command which started them.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from services.infra.errors import InfraError
from services.infra.ports import LOOPBACK, free_port, require_free_port, start_with_repicks
from services.infra.postgres_account import PostgresAccount, postgres_account
from services.infra.postgres_binaries import postgres_bin_path, postgres_binary
from services.infra.processes import pid_runs, stop_child, track_detached
from services.infra.readiness import wait_until_ready
from services.infra.server_log import ServerLog

logger = structlog.get_logger(__name__)

SUPERUSER = "postgres"
DEFAULT_DATABASE = "oms"
INITDB_TIMEOUT = 120.0
CLIENT_TIMEOUT = 10.0
# sockaddr_un.sun_path holds 108 bytes; stay well clear of it.
_MAX_SOCKET_PATH = 100
# Durability traded for speed: fine for throwaway test servers, never for `oms infra up`.
FAST_UNSAFE_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


class EmbeddedPostgres:
    """One postgres process listening on 127.0.0.1:`port`, data in `data_dir` (its PGDATA).

    Trust authentication for superuser `postgres`, database `database` created on first start.
    The server's output goes to `data_dir/postgres.log`.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        fast_unsafe: bool = False,
        *,
        database: str = DEFAULT_DATABASE,
        server_settings: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 30.0,
        bin_dir: Path | None = None,
    ) -> None:
        if not _IDENTIFIER.fullmatch(database):
            raise InfraError(f"database name {database!r} must be a plain lower-case identifier")
        self.data_dir = data_dir.resolve()
        self.port = port if port is not None else free_port()
        self._port_picked = port is None
        self.fast_unsafe = fast_unsafe
        self.database = database
        self.server_settings = dict(server_settings or {})
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        # Another build of PostgreSQL (pgserver's is built without SSL): its bin folder.
        self.bin_dir = bin_dir
        self.log = ServerLog(self.data_dir / "postgres.log")
        self._process: subprocess.Popen[bytes] | None = None
        self._detached = False

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.port}/{self.database}"

    @property
    def bin_path(self) -> Path:
        """Folder of the PostgreSQL client tools (psql, pgbench) matching this server."""
        return self.bin_dir if self.bin_dir is not None else postgres_bin_path()

    def _binary(self, name: str) -> Path:
        if self.bin_dir is None:
            return postgres_binary(name)
        binary = self.bin_dir / name
        if not binary.is_file():
            raise InfraError(f"{name} not found in {self.bin_dir}")
        return binary

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, detached: bool = False) -> None:
        """Initialise the data folder if new, start postgres, wait until it accepts queries.

        `detached` puts postgres in its own session so it outlives this process.
        """
        if self.is_running():
            return
        start_with_repicks(
            lambda: self._start_once(detached), self._repick if self._port_picked else None
        )

    def _repick(self) -> None:
        logger.warning("postgres port taken before it was bound; picking another", port=self.port)
        self.port = free_port()

    def _start_once(self, detached: bool) -> None:
        require_free_port(LOOPBACK, self.port, "postgres")
        account = postgres_account()
        self._prepare_data_dir(account)
        clear_stale_postmaster_pid(self.data_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(account)
        socket_dir = self._socket_dir(account)
        with self.log.open_for_run() as log_file:
            self._process = subprocess.Popen(
                self._server_command(socket_dir),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=_environment_without_libpq_variables(),
                start_new_session=detached,
                **_run_as(account),
            )
        self._detached = detached
        try:
            wait_until_ready(
                self._process,
                self._accepts_connections,
                server=f"postgres ({LOOPBACK}:{self.port})",
                timeout=self.startup_timeout,
                log=self.log,
            )
            self._ensure_database()
        except BaseException:
            self.stop()
            raise
        if detached:
            track_detached(self._process)

    def wait(self) -> int:
        """Until the server exits, however it ends; its exit status (0 if never started)."""
        return 0 if self._process is None else self._process.wait()

    def stop(self) -> None:
        """SIGINT (fast shutdown), then SIGKILL after `stop_timeout` seconds. Safe to call twice."""
        if self._process is None:
            return
        stop_child(self._process, signal.SIGINT, self.stop_timeout, own_group=self._detached)

    def psql(self, sql: str, database: str = SUPERUSER) -> str:
        """Run one SQL command through psql and return its unaligned, tuples-only output."""
        command = [
            str(self._binary("psql")),
            *self._client_arguments(),
            "--dbname",
            database,
            "--no-psqlrc",
            "--set",
            "ON_ERROR_STOP=1",
            "--tuples-only",
            "--no-align",
            "--command",
            sql,
        ]
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=CLIENT_TIMEOUT,
                env=_environment_without_libpq_variables(),
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise InfraError(f"psql did not answer within {CLIENT_TIMEOUT:g} s: {sql}") from error
        if result.returncode != 0:
            raise InfraError(f"psql failed ({sql}): {result.stderr.strip()}")
        return result.stdout.strip()

    def _client_arguments(self) -> list[str]:
        return ["--host", LOOPBACK, "--port", str(self.port), "--username", SUPERUSER]

    def _prepare_data_dir(self, account: PostgresAccount | None) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if account is not None:
            account.hand_over(self.data_dir)

    def _initdb(self, account: PostgresAccount | None) -> None:
        command = [
            str(self._binary("initdb")),
            "--pgdata",
            str(self.data_dir),
            "--auth=trust",
            f"--username={SUPERUSER}",
            "--encoding=UTF8",
            # C collation: byte order, identical on every machine, and the fastest.
            "--locale=C",
        ]
        if self.fast_unsafe:
            command.append("--no-sync")
        # initdb runs postgres in bootstrap mode as a child; a file instead of a pipe for its
        # output means a stuck child holding the pipe cannot hang us past the timeout.
        with tempfile.TemporaryFile() as output:
            try:
                result = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    timeout=INITDB_TIMEOUT,
                    env=_environment_without_libpq_variables(),
                    check=False,
                    **_run_as(account),
                )
                failure = None if result.returncode == 0 else f"exited with {result.returncode}"
            except subprocess.TimeoutExpired:
                failure = f"did not finish within {INITDB_TIMEOUT:g} s"
            if failure is not None:
                output.seek(0)
                lines = output.read().decode(errors="replace").splitlines()[-30:]
                raise InfraError(
                    f"initdb for {self.data_dir} {failure}; its last lines:\n" + "\n".join(lines)
                )

    def _socket_dir(self, account: PostgresAccount | None) -> Path:
        # psql and pgbench on this machine may prefer the unix socket; its path must fit in
        # sockaddr_un, so deep data folders get a short stand-in under /tmp.
        if len(str(self.data_dir / ".s.PGSQL.65535")) <= _MAX_SOCKET_PATH:
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        socket_dir = Path(tempfile.gettempdir()) / f"oms-pg-{digest}"
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        if account is not None:
            account.hand_over(socket_dir)
        return socket_dir

    def _server_command(self, socket_dir: Path) -> list[str]:
        settings = {
            "listen_addresses": LOOPBACK,
            "port": str(self.port),
            "unix_socket_directories": f'"{socket_dir}"',
            "max_connections": "200",
            **(FAST_UNSAFE_SETTINGS if self.fast_unsafe else {}),
            **self.server_settings,
        }
        command = [str(self._binary("postgres")), "-D", str(self.data_dir)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        return command

    def _accepts_connections(self) -> bool:
        try:
            result = subprocess.run(
                [
                    str(self._binary("pg_isready")),
                    *self._client_arguments(),
                    "--dbname",
                    SUPERUSER,
                    "--timeout",
                    "1",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=CLIENT_TIMEOUT,
                env=_environment_without_libpq_variables(),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0

    def _ensure_database(self) -> None:
        exists = self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'")
        if exists != "1":
            self.psql(f"CREATE DATABASE {self.database}")

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def clear_stale_postmaster_pid(data_dir: Path) -> None:
    """Refuse a data folder a live postgres holds; forget the lock of a dead one.

    postgres itself refuses to start when the recorded pid now belongs to any live process,
    which after a container restart is often an unrelated program.
    """
    pid_file = data_dir / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except FileNotFoundError:
        return
    pid = _recorded_pid(lines)
    if pid is not None and pid_runs(pid, "postgres"):
        port = lines[3].strip() if len(lines) > 3 else "unknown"
        raise InfraError(
            f"postgres data folder {data_dir} is in use by a running postgres "
            f"(pid {pid}, port {port}): stop it first (`oms infra down`, or `kill -INT {pid}`) "
            "or use another folder"
        )
    logger.warning("removing stale postmaster.pid", data_dir=str(data_dir), dead_pid=pid)
    pid_file.unlink(missing_ok=True)


def _recorded_pid(lines: list[str]) -> int | None:
    try:
        return int(lines[0])
    except (IndexError, ValueError):
        # Empty or torn: written by a postmaster that died while starting.
        return None


def _run_as(account: PostgresAccount | None) -> dict[str, Any]:
    if account is None:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": []}


def _environment_without_libpq_variables() -> dict[str, str]:
    # PGHOST, PGPASSWORD, PGSSLMODE... from a developer's shell must not redirect our tools.
    return {name: value for name, value in os.environ.items() if not name.startswith("PG")}
