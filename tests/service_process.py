"""A real `oms <service>` subprocess for tests: start, wait for SERVING, kill -9, restart, reap.

Every incarnation runs `python -m services.command_line <service> ...` on the same
data folder and loopback port, with its output appended to one log file, so a
failure shows the whole history. Waiting is always polling against a deadline;
stopping always reaps the child and kills its process group (what it forked), also
when the test failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.infra.ports import LOOPBACK, free_port
from services.transport.tls import MeshTransport

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 10.0
STACKS_WAIT_S = 1.0  # for a process that does not stop to write where it waits (SIGUSR1)
POLL_INTERVAL_S = 0.05
# A restarted server on the same port is found again within ~0.1 s instead of gRPC's
# default reconnect backoff (1 s, growing); and a new channel gets its own connection
# rather than the process-wide one still backing off from the previous incarnation.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)


class ServiceProcessError(AssertionError):
    """The service did not start, did not stop, or exited when it should not have."""


class ServiceProcess:
    """One service served by a child process; restartable on the same data and port.

    Subclasses name the `oms` subcommand, the gRPC service whose health is
    polled, and their own arguments (`service_arguments`).
    """

    subcommand = ""
    service_name = ""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        # Where it listens and is reached: loopback, or a network namespace's side of its
        # link (`tests/partitions/network_namespace.py`).
        self.host = LOOPBACK
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.environment = dict(environment or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.incarnations = 0
        # Run before the service's own command, which it then execs (a test's wrapper:
        # `tests/partitions/nft_partition.py` puts the process in its cgroup first).
        self.command_prefix: list[str] = []
        # The module that runs `oms`: another build of it for an upgrade test
        # (`tests/upgrade/next_release.py`: this code plus a newer state-machine version).
        self.entry_module = "services.command_line"
        # The tree it runs from: another release's checkout for a mixed-release test
        # (`tests/upgrade/test_mixed_releases.py`), else this one.
        self.source_root = ROOT
        # How the test reaches it: plaintext, as the suite runs (`OMS_TLS=off`), unless a
        # test gives the process TLS settings and this the identity to match.
        self.transport = MeshTransport.plaintext()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServiceProcessError(f"the {self.subcommand} was never started")
        return self.process.pid

    def service_arguments(self) -> list[str]:
        return []

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Spawn a new incarnation (the previous one must be gone)."""
        if self.running():
            raise ServiceProcessError(f"{self.subcommand} pid {self.pid} still runs")
        environment = {**os.environ, **self.environment, "PYTHONPATH": str(self.source_root)}
        command = [
            *self.command_prefix,
            sys.executable,
            "-m",
            self.entry_module,
            self.subcommand,
            *self.service_arguments(),
            "--listen",
            self.address,
            "--data-dir",
            str(self.data_dir),
        ]
        self.incarnations += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- incarnation {self.incarnations}: {' '.join(command)}\n".encode())
            log.flush()
            # Its own process group, so a kill takes its forked children too (a snapshot
            # child), as a container's end does: no test leaves one running behind it.
            self.process = subprocess.Popen(
                command,
                cwd=self.source_root,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def health(self, timeout_s: float = 1.0) -> int:
        """The health status of the service (raises grpc.RpcError if unreachable)."""
        with self.transport.blocking_channel(self.address, CHANNEL_OPTIONS) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=self.service_name), timeout=timeout_s
            )
            return int(response.status)

    def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll grpc.health.v1 until the service is SERVING; fail if the child exits."""
        deadline = time.monotonic() + timeout_s
        with self.transport.blocking_channel(self.address, CHANNEL_OPTIONS) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.process is None or self.process.poll() is not None:
                    code = None if self.process is None else self.process.returncode
                    raise ServiceProcessError(
                        f"{self.subcommand} exited with {code} while starting\n{self.log_tail()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServiceProcessError(
                        f"{self.subcommand} not SERVING within {timeout_s:g} s\n{self.log_tail()}"
                    )
                try:
                    response = health.Check(
                        health_pb2.HealthCheckRequest(service=self.service_name),
                        timeout=min(1.0, remaining),
                    )
                    if response.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass  # not listening yet
                time.sleep(POLL_INTERVAL_S)

    def start_serving(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.start()
        try:
            self.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL the current incarnation (a crash) and reap it."""
        process = self.process
        if process is None or process.poll() is not None:
            raise ServiceProcessError(f"no running {self.subcommand} to kill")
        _kill_group(process)
        process.wait(EXIT_TIMEOUT_S)

    def terminate(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        """SIGTERM (graceful stop) and return the exit code; fail if it takes over `timeout_s`."""
        process = self.process
        if process is None or process.poll() is not None:
            raise ServiceProcessError(f"no running {self.subcommand} to terminate")
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while process.poll() is None:
            if time.monotonic() >= deadline:
                # Where it hangs, in its log, before it is killed (stop_signals.py).
                process.send_signal(signal.SIGUSR1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(STACKS_WAIT_S)
                self.stop()
                tail = self.log_tail(200)
                raise ServiceProcessError(
                    f"{self.subcommand} still ran {timeout_s:g} s after SIGTERM\n{tail}"
                )
            time.sleep(POLL_INTERVAL_S)
        return process.returncode

    def stop(self) -> None:
        """Kill if still running, and reap: safe to call any time, any number of times."""
        process = self.process
        if process is None:
            return
        _kill_group(process)
        process.wait(EXIT_TIMEOUT_S)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start_serving()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the service and whatever it forked (its group outlives it while they run)."""
    with contextlib.suppress(ProcessLookupError):  # the service and its children are gone
        os.killpg(process.pid, signal.SIGKILL)


def start_together(processes: Sequence[ServiceProcess], stop_all: Callable[[], None]) -> None:
    """Start `processes` at once and wait until each is SERVING; on any failure, `stop_all()`."""
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.wait_serving()
    except BaseException:
        stop_all()
        raise


def aio_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


class ShardFollowerProcess(ServiceProcess):
    """A stateless service that follows one shard and every matcher group (the bridge,
    the reconciler): its data folder only names its log file (the harness passes
    `--data-dir`, which such a service accepts and ignores)."""

    service_name = ""  # the server as a whole: it serves only health and status
    default_environment: Mapping[str, str] = {}

    def __init__(
        self,
        data_dir: Path,
        *,
        shard_address: str,
        matchers: Mapping[str, str],
        shard_id: str = "s1",
        port: int | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        matcher_text = ",".join(f"{group}={address}" for group, address in matchers.items())
        super().__init__(
            data_dir,
            port=port,
            environment={
                "OMS_MATCHERS": matcher_text,
                "OMS_SHARD_ID": shard_id,
                **self.default_environment,
                **(environment or {}),
            },
        )
        self.shard_address = shard_address

    def service_arguments(self) -> list[str]:
        return ["--shard-address", self.shard_address]
