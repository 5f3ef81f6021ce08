"""`oms bench failover`: from SIGKILL of a group's leader to its successor's first answer.

For a user shard, then for a matcher group: three replicas of the group as real
`oms shard` / `oms matcher` processes over a log in etcd (as `oms up --replicas 3`
runs them), and a steady load of commands through a client that finds the leader
in etcd and retries each command with its ids until it is answered, as the mesh's
own clients do (a `ShardLink` for the shard; one-batch `Matcher/Execute` calls for
the matcher). Then, per kill: the leader (the replica whose `oms.v1.Status` says so)
is SIGKILLed, and the figure is the time from the kill to the first acknowledgement
of a command sent after it; the killed replica is then started again on its folder
as a follower, and the next kill waits until it has caught up with the leader.

The figure holds the lease running out (`--lease-ttl-s`), a follower's campaign and
its read to the log's end, and the clients finding the new leader (a leader-key
lookup, a reconnect). The goal is at most 3 s with the default 2 s lease.

The etcd is an embedded one with fsync on, in the run's temporary folder, unless
`OMS_ETCD_ENDPOINTS` names one. The groups run as mesh `bench-failover`
(`/oms/v1/bench-failover/matcher/g1/`), apart from any mesh's keys; two runs on one
etcd would share them, so on an etcd of the caller's choosing the benchmark says so,
refuses a group that already holds keys there, and deletes its groups' keys when it
ends.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import uvloop

from protos.oms.v1 import (
    common_pb2,
    matcher_pb2,
    matcher_pb2_grpc,
    shard_pb2,
    status_pb2,
    status_pb2_grpc,
)
from services.bench.runtime_bench import EtcdPlace, etcd_for_bench, load_average, machine_line
from services.clients.channels import mesh_channel
from services.clients.shard_link import ShardLink, ShardUnavailableError
from services.coordination.addresses import LeaderAddress
from services.coordination.errors import CoordinationUnavailable
from services.coordination.etcd_session import EtcdSession, prefix_end
from services.coordination.group_keys import GroupKeys
from services.infra.ports import LOOPBACK, free_port
from services.infra.settings import InfraSettings
from services.markets.catalog import Market, MarketCatalogError, load_catalog
from services.observability.logs import configure_logging
from services.settings import load_settings, setting
from services.transport.tls import ClientTransport, MeshTransport, use_transports

BENCH_MESH_ID = "bench-failover"  # the groups' namespace in etcd, apart from any mesh
REPLICAS = 3
DEFAULT_KILLS = 5
DEFAULT_LEASE_TTL_S = 2
GOAL_S = 3.0  # with the default lease; a longer lease moves the goal by as much
CALLERS = 8
PAUSE_S = 0.02  # per caller after each answer: 8 callers offer a few hundred commands/s
# Per caller after a refusal: often enough to see the new leader within a few tens of
# ms, seldom enough not to load the survivors (and the machine) while they elect one.
RETRY_PAUSE_S = 0.05
COMMAND_TIMEOUT_S = 2.0
STATUS_TIMEOUT_S = 1.0
POLL_S = 0.05
ACK_POLL_S = 0.01  # only how soon a kill's figure is seen: its acknowledgement is timestamped
# Three Python services starting at once on a loaded 2-core machine take seconds each.
START_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 60.0
FAILOVER_MARGIN_S = 20.0  # past the lease: no new leader by then is a failure, not a figure
KILL_WAIT_S = 10.0  # SIGKILL cannot be ignored; this only bounds the kernel's teardown
# Acknowledged before each kill, so the load runs on the leader about to die.
STEADY_ACKS = 100
ORDER_SHARD = "bench-failover"  # the OMS shard named in the matcher orders' ids
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


class FailoverBenchError(RuntimeError):
    """A replica did not start, no leader came, or the load stopped: no figure."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kills",
        type=_positive_int,
        default=DEFAULT_KILLS,
        help="leaders SIGKILLed per group (default %(default)s)",
    )
    parser.add_argument(
        "--lease-ttl-s",
        type=_positive_int,
        default=DEFAULT_LEASE_TTL_S,
        dest="lease_ttl_s",
        help="the leader key's lease of every replica (default %(default)s)",
    )
    parser.add_argument(
        "--matcher-group",
        default="g1",
        dest="matcher_group",
        help="the matcher group to run (default %(default)s; its markets come from the catalog)",
    )
    parser.add_argument(
        "--markets-file",
        type=Path,
        default=None,
        dest="markets_file",
        help="market catalog for the matcher (default: OMS_MARKETS_FILE, else the packaged one)",
    )


# --- replica processes ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    leading: bool
    term: int
    applied_position: int


async def status_of(address: str) -> ReplicaStatus | None:
    """What the replica's `oms.v1.Status` says; None while it does not answer."""
    try:
        async with mesh_channel(address) as channel:
            report = await status_pb2_grpc.StatusStub(channel).GetStatus(
                status_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S
            )
    except grpc.aio.AioRpcError:
        return None
    counters = report.counters
    return ReplicaStatus(
        leading=bool(counters["leading"]),
        term=counters["term"],
        applied_position=counters["applied_position"],
    )


class ReplicaProcess:
    """One replica as an `oms <kind>` child process, restartable on its folder and port."""

    def __init__(
        self,
        kind: str,
        root: Path,
        name: str,
        arguments: Sequence[str],
        environment: dict[str, str],
    ) -> None:
        self.kind = kind
        self.name = name
        self.port = free_port()
        self.data_dir = root / name
        self.log_path = root / f"{name}.log"
        self.arguments = [*arguments, "--listen", self.address, "--data-dir", str(self.data_dir)]
        self.environment = {**environment, f"OMS_{kind.upper()}_ADVERTISE": self.address}
        self.process: subprocess.Popen[bytes] | None = None
        self.incarnations = 0
        # The module that runs `oms`: another build's for `oms bench upgrade`.
        self.entry_module = "services.command_line"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.incarnations += 1
        command = [sys.executable, "-m", self.entry_module, self.kind, *self.arguments]
        with self.log_path.open("ab") as log:
            log.write(f"--- incarnation {self.incarnations}: {' '.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.environment},
            )

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to resign the lease."""
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()

    def terminate(self) -> None:
        """SIGTERM: a graceful stop (a leader resigns its lease), as a rolling update does."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()

    async def reaped(self) -> None:
        process = self.process
        deadline = time.monotonic() + KILL_WAIT_S
        while process is not None and process.poll() is None:
            if time.monotonic() > deadline:
                raise FailoverBenchError(f"{self.name} outlived its stop for {KILL_WAIT_S:g} s")
            await asyncio.sleep(ACK_POLL_S)

    def stop(self) -> None:
        """SIGKILL and reap; safe any time, any number of times (the cleanup's last word)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(KILL_WAIT_S)

    def describe_exit(self) -> str:
        code = None if self.process is None else self.process.returncode
        return f"{self.name} exited with {code}; its log ends:\n{self.log_tail()}"

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class ReplicaGroup:
    """The replicas of one group; its leader is whichever one says so in its status."""

    def __init__(self, kind: str, name: str, replicas: list[ReplicaProcess]) -> None:
        self.kind = kind
        self.name = name
        self.replicas = replicas

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    def tails(self) -> str:
        return "\n".join(f"--- {r.name}:\n{r.log_tail(10)}" for r in self.replicas)

    async def statuses(self) -> dict[ReplicaProcess, ReplicaStatus]:
        running = [replica for replica in self.replicas if replica.running()]
        answers = await asyncio.gather(*(status_of(replica.address) for replica in running))
        return {
            replica: status
            for replica, status in zip(running, answers, strict=True)
            if status is not None
        }

    async def wait_answering(self, replica: ReplicaProcess, timeout_s: float) -> ReplicaStatus:
        deadline = time.monotonic() + timeout_s
        while True:
            if not replica.running():
                raise FailoverBenchError(replica.describe_exit())
            status = await status_of(replica.address)
            if status is not None:
                return status
            if time.monotonic() > deadline:
                raise FailoverBenchError(
                    f"{replica.name} did not answer in {timeout_s:g} s:\n{replica.log_tail()}"
                )
            await asyncio.sleep(POLL_S)

    async def wait_leader(
        self, timeout_s: float, *, newer_than: int = 0
    ) -> tuple[ReplicaProcess, ReplicaStatus]:
        """The replica leading a term newer than `newer_than`, once there is one."""
        deadline = time.monotonic() + timeout_s
        while True:
            leaders = [
                (replica, status)
                for replica, status in (await self.statuses()).items()
                if status.leading and status.term > newer_than
            ]
            if leaders:
                # Two claim it only while a deposed one has yet to learn: the newer term leads.
                return max(leaders, key=lambda found: found[1].term)
            if time.monotonic() > deadline:
                raise FailoverBenchError(
                    f"{self.label}: no leader past term {newer_than} in {timeout_s:g} s\n"
                    f"{self.tails()}"
                )
            await asyncio.sleep(POLL_S)

    async def wait_caught_up(self, replica: ReplicaProcess, timeout_s: float) -> None:
        """Until `replica` has applied what the leader had applied once it was back.

        Under load the leader moves on meanwhile; a position it had already reached is
        a target the follower can reach, and reaching it means it replays no backlog.
        """
        deadline = time.monotonic() + timeout_s
        await self.wait_answering(replica, timeout_s)
        _, leader = await self.wait_leader(max(0.0, deadline - time.monotonic()))
        while True:
            if not replica.running():
                raise FailoverBenchError(replica.describe_exit())
            status = await status_of(replica.address)
            if status is not None and status.applied_position >= leader.applied_position:
                return
            if time.monotonic() > deadline:
                raise FailoverBenchError(
                    f"{replica.name} not at the leader's position {leader.applied_position} in "
                    f"{timeout_s:g} s (last: {status}):\n{replica.log_tail()}"
                )
            await asyncio.sleep(POLL_S)


# --- the loads ------------------------------------------------------------------------------


class RetryLater(Exception):
    """No answer this time (no leader yet, the old one gone, a follower refused): same ids."""


class CommandLoad(abc.ABC):
    """`callers` callers, each sending one command at a time and retrying it until answered."""

    def __init__(self, callers: int) -> None:
        self.callers = callers
        # (attempt started, acknowledged), monotonic, in the order the answers came.
        self.acks: list[tuple[float, float]] = []
        self.retries = 0
        self._task: asyncio.Task[None] | None = None

    @abc.abstractmethod
    async def attempt(self, caller: int, sequence: int) -> None:
        """Send command `sequence` of `caller` once; RetryLater if it was not answered."""

    @abc.abstractmethod
    async def prepare(self) -> None:
        """What the group needs before the first command."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the load's connections."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Its own failure, if any, was raised to the waits that saw it end.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.close()

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for caller in range(1, self.callers + 1):
                group.create_task(self._caller(caller))

    async def _caller(self, caller: int) -> None:
        sequence = 0
        while True:
            sequence += 1
            while True:
                started = time.monotonic()
                try:
                    await self.attempt(caller, sequence)
                except (RetryLater, TimeoutError):
                    self.retries += 1
                    await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                self.acks.append((started, time.monotonic()))
                break
            await asyncio.sleep(PAUSE_S)

    def _check_running(self) -> None:
        task = self._task
        if task is None:
            raise FailoverBenchError("the load is not running")
        if task.done():
            error = None if task.cancelled() else task.exception()
            raise FailoverBenchError(f"the load stopped: {error!r}") from error

    async def wait_acks(self, count: int, timeout_s: float) -> None:
        target = len(self.acks) + count
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < target:
            self._check_running()
            if time.monotonic() > deadline:
                raise FailoverBenchError(
                    f"{count} commands not answered in {timeout_s:g} s ({self.retries} retries)"
                )
            await asyncio.sleep(POLL_S)

    async def first_ack_after(self, killed_at: float, scan_from: int, timeout_s: float) -> float:
        """When a command first sent after `killed_at` was first acknowledged.

        An attempt started before the kill went to the old leader (the link fails
        whatever its broken stream carried), so an answer to it that lands after the
        kill was in flight and says nothing about the new leader.
        """
        deadline = killed_at + timeout_s
        index = scan_from
        while True:
            acks = self.acks
            while index < len(acks):
                started, acknowledged = acks[index]
                if started > killed_at:
                    return acknowledged
                index += 1
            self._check_running()
            if time.monotonic() > deadline:
                raise FailoverBenchError(
                    f"no command answered in {timeout_s:g} s after the kill "
                    f"({self.retries} retries so far)"
                )
            await asyncio.sleep(ACK_POLL_S)


def _hydrate(user_id: int) -> shard_pb2.ShardCommand:
    """A known user with nothing: what the persister would load for a new account."""
    command = shard_pb2.ShardCommand()
    command.hydrate.user_id = user_id
    command.hydrate.known = True
    state = command.hydrate.state
    state.user_id = user_id
    state.tier = shard_pb2.USER_TIER_NORMAL
    return command


def _deposit(user_id: int, transfer_id: str) -> shard_pb2.ShardCommand:
    command = shard_pb2.ShardCommand()
    command.deposit.user_id = user_id
    command.deposit.asset = "USDT"
    command.deposit.amount = 1
    command.deposit.transfer_id = transfer_id
    return command


class ShardLoad(CommandLoad):
    """Deposits of 1 unit to one hydrated user per caller, through a `ShardLink` to the
    shard's leader as etcd names it; a transfer id retried is answered once (dedup)."""

    def __init__(self, etcd_endpoints: Sequence[str], shard_id: str, callers: int) -> None:
        super().__init__(callers)
        self.source = LeaderAddress(etcd_endpoints, BENCH_MESH_ID, "shard", shard_id)
        self.link = ShardLink(self.source)

    async def prepare(self) -> None:
        # Hydrated users answer at once; others would be parked waiting for a persister.
        await self.link.send([_hydrate(user_id) for user_id in range(1, self.callers + 1)])
        try:
            await self.link.wait_ready(START_TIMEOUT_S)
        except TimeoutError as error:
            raise FailoverBenchError(f"no stream to the shard in {START_TIMEOUT_S:g} s") from error

    async def attempt(self, caller: int, sequence: int) -> None:
        # A new message each attempt: the link stamps its correlation id on it.
        command = _deposit(caller, f"failover-{caller}-{sequence}")
        try:
            result = await self.link.execute(command, timeout_s=COMMAND_TIMEOUT_S)
        except ShardUnavailableError as error:
            raise RetryLater(str(error)) from error
        if not result.accepted:
            raise FailoverBenchError(f"the shard refused a deposit: {result}")

    async def close(self) -> None:
        await self.link.close()
        await self.source.close()  # the link leaves its address source to its owner


class MatcherLoad(CommandLoad):
    """IOC buys below the reference price on the group's `Execute` stream, one batch per
    call to the leader as etcd names it. With no sellers each is accepted and its
    remainder cancelled at once: nothing rests, nothing trades, every one is answered.
    An order id retried is answered once (dedup)."""

    def __init__(
        self, etcd_endpoints: Sequence[str], group: str, market: Market, callers: int
    ) -> None:
        super().__init__(callers)
        self.source = LeaderAddress(etcd_endpoints, BENCH_MESH_ID, "matcher", group)
        self.channels: dict[str, grpc.aio.Channel] = {}
        self.symbol = market.symbol
        # Half the price band below the reference: inside the band, under any seller.
        reference = market.reference_price_ticks
        self.price_ticks = max(1, reference - reference * market.price_band_bps // 20_000)
        lot_notional = self.price_ticks * market.tick_size
        self.quantity_lots = max(1, -(-market.min_notional // lot_notional))

    async def prepare(self) -> None:
        """Nothing: a matcher takes any well-formed order of its symbols."""

    async def attempt(self, caller: int, sequence: int) -> None:
        try:
            address = await self.source.resolve()
        except CoordinationUnavailable as error:
            raise RetryLater(str(error)) from error
        channel = self.channels.get(address)
        if channel is None:
            channel = self.channels[address] = mesh_channel(address)
        order = matcher_pb2.Order(
            order_id=f"{ORDER_SHARD}:{caller}:{sequence}",
            user_id=caller,
            symbol=self.symbol,
            side=common_pb2.SIDE_BUY,
            order_type=common_pb2.ORDER_TYPE_LIMIT,
            time_in_force=common_pb2.TIME_IN_FORCE_IOC,
            price_ticks=self.price_ticks,
            quantity_lots=self.quantity_lots,
        )
        command = matcher_pb2.MatcherCommand(
            correlation_id=sequence, submit=matcher_pb2.SubmitOrder(order=order)
        )
        call = matcher_pb2_grpc.MatcherStub(channel).Execute(
            iter([matcher_pb2.MatcherCommandBatch(commands=[command])]),
            timeout=COMMAND_TIMEOUT_S,
        )
        try:
            answers = [answer async for answer in call]
        except grpc.aio.AioRpcError as error:
            if error.code() in FATAL_CODES:
                raise FailoverBenchError(f"the matcher refused an order: {error}") from error
            raise RetryLater(str(error.code())) from error
        results = [result for answer in answers for result in answer.results]
        if len(results) != 1 or results[0].reject_reason:
            raise FailoverBenchError(f"the matcher answered an order with {results}")

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()
        self.channels.clear()
        await self.source.close()


# --- the run --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupPlan:
    kind: str
    name: str
    arguments: tuple[str, ...]  # for `oms <kind>`, before --listen and --data-dir

    @property
    def keys(self) -> GroupKeys:
        return GroupKeys.of(BENCH_MESH_ID, self.kind, self.name)


@dataclass(frozen=True, slots=True)
class GroupResult:
    label: str
    failovers: list[float]


def replica_group(
    plan: GroupPlan, root: Path, etcd_endpoints: Sequence[str], lease_ttl_s: int
) -> ReplicaGroup:
    setting = f"OMS_{plan.kind.upper()}_"
    environment = {
        f"{setting}LOG": "etcd",
        f"{setting}LEASE_TTL_S": str(lease_ttl_s),
        "OMS_ETCD_ENDPOINTS": ",".join(etcd_endpoints),
        "OMS_MESH_ID": BENCH_MESH_ID,
        # Plaintext, like the benchmark's own channels (`run`): failover is measured
        # here, and `oms bench e2e` measures what TLS costs.
        "OMS_TLS": "off",
    }
    replicas = [
        ReplicaProcess(
            plan.kind, root, f"{plan.kind}-{plan.name}-r{index}", plan.arguments, environment
        )
        for index in range(1, REPLICAS + 1)
    ]
    return ReplicaGroup(plan.kind, plan.name, replicas)


def _progress(text: str) -> None:
    # stderr: stdout holds the table alone.
    print(f"[failover] {text}", file=sys.stderr, flush=True)


async def measure_group(
    group: ReplicaGroup, load: CommandLoad, kills: int, lease_ttl_s: int
) -> list[float]:
    """Start the group and its load, kill its leader `kills` times; each kill's seconds."""
    failover_timeout_s = lease_ttl_s + FAILOVER_MARGIN_S
    _progress(f"{group.label}: starting {len(group.replicas)} replicas")
    group.start()
    for replica in group.replicas:
        await group.wait_answering(replica, START_TIMEOUT_S)
    await group.wait_leader(START_TIMEOUT_S)
    await load.prepare()
    load.start()
    await load.wait_acks(STEADY_ACKS, START_TIMEOUT_S)
    failovers: list[float] = []
    for kill in range(1, kills + 1):
        leader, status = await group.wait_leader(failover_timeout_s)
        scan_from = len(load.acks)
        killed_at = time.monotonic()
        leader.kill()
        acknowledged_at = await load.first_ack_after(killed_at, scan_from, failover_timeout_s)
        failovers.append(acknowledged_at - killed_at)
        _progress(f"{group.label}: kill {kill} of {kills}: {failovers[-1]:.2f} s")
        await leader.reaped()
        # The answer came from a replica that won a newer term, not from a stale one.
        await group.wait_leader(failover_timeout_s, newer_than=status.term)
        if kill < kills:
            leader.start()  # its folder and port again: it recovers and follows
            await group.wait_caught_up(leader, CATCH_UP_TIMEOUT_S)
            await load.wait_acks(STEADY_ACKS, failover_timeout_s)
    return failovers


async def refuse_used_groups(etcd_endpoints: Sequence[str], plans: Sequence[GroupPlan]) -> None:
    """Never join a group someone else runs (or a crashed run left) on a shared etcd."""
    async with EtcdSession(etcd_endpoints) as session:
        for plan in plans:
            prefix = plan.keys.prefix
            if await session.range(prefix, prefix_end(prefix), limit=1, keys_only=True):
                raise FailoverBenchError(
                    f"{plan.kind} {plan.name} already has keys under {prefix.decode()} in etcd "
                    f"{','.join(etcd_endpoints)}: a running group, or a run that ended without "
                    "its cleanup; choose another etcd (unset OMS_ETCD_ENDPOINTS for an "
                    "embedded one) or another --matcher-group"
                )


async def delete_group_keys(etcd_endpoints: Sequence[str], plans: Sequence[GroupPlan]) -> None:
    """The groups' logs would otherwise be the next run's (or a mesh's) starting state."""
    try:
        async with EtcdSession(etcd_endpoints) as session:
            deletes = [(plan.keys.prefix, prefix_end(plan.keys.prefix)) for plan in plans]
            await session.transaction((), deletes=deletes)
    except CoordinationUnavailable as error:
        # Said, not raised: an error of the run itself may be on its way out.
        prefixes = ", ".join(plan.keys.prefix.decode() for plan in plans)
        _progress(f"warning: keys under {prefixes} left in etcd: {error}")


async def run_groups(
    arguments: argparse.Namespace,
    plans: Sequence[GroupPlan],
    market: Market,
    *,
    root: Path,
    etcd: EtcdPlace,
    shared_etcd: bool,
    groups: list[ReplicaGroup],
) -> list[GroupResult]:
    """Each group in turn; every group started is in `groups` for the caller's cleanup."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    sigterm = False
    if main is not None:
        # A SIGTERM ends the run as Ctrl-C does: through every cleanup below.
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread
            loop.add_signal_handler(signal.SIGTERM, main.cancel)
            sigterm = True
    try:
        if shared_etcd:
            await refuse_used_groups(etcd.endpoints, plans)
        results: list[GroupResult] = []
        try:
            for plan in plans:
                group = replica_group(plan, root, etcd.endpoints, arguments.lease_ttl_s)
                groups.append(group)
                load: CommandLoad = (
                    ShardLoad(etcd.endpoints, plan.name, CALLERS)
                    if plan.kind == "shard"
                    else MatcherLoad(etcd.endpoints, plan.name, market, CALLERS)
                )
                try:
                    failovers = await measure_group(
                        group, load, arguments.kills, arguments.lease_ttl_s
                    )
                finally:
                    await load.stop()
                    group.stop()
                results.append(GroupResult(group.label, failovers))
        finally:
            if shared_etcd:
                # Only once every replica is reaped: a live leader would write again.
                for group in groups:
                    group.stop()
                await delete_group_keys(etcd.endpoints, plans)
        return results
    finally:
        if sigterm:
            loop.remove_signal_handler(signal.SIGTERM)


def plan_groups(
    arguments: argparse.Namespace, markets_file: Path | None, shard_prefix: str = "failover"
) -> tuple[tuple[GroupPlan, ...], Market]:
    """The shard under a fresh name, the matcher group as named; the market its orders use."""
    markets = load_catalog(markets_file).group(arguments.matcher_group)
    if not markets:
        raise FailoverBenchError(f"no market belongs to matcher group {arguments.matcher_group}")
    matcher_arguments = ["--group", arguments.matcher_group]
    if markets_file is not None:
        matcher_arguments += ["--markets-file", str(markets_file)]
    shard_id = f"{shard_prefix}-{os.getpid()}-{secrets.token_hex(3)}"
    plans = (
        GroupPlan("shard", shard_id, ("--shard-id", shard_id)),
        GroupPlan("matcher", arguments.matcher_group, tuple(matcher_arguments)),
    )
    return plans, markets[0]


@dataclass(frozen=True)
class CatalogSetting:
    """The catalog the matcher reads, so the orders fit its markets."""

    markets_file: Path | None = setting(
        env="OMS_MARKETS_FILE", default=None, help="market catalog (default: packaged)"
    )


def goal_s(lease_ttl_s: int) -> float:
    """3 s with the default lease; a lease longer by n s must expire n s later."""
    return GOAL_S + lease_ttl_s - DEFAULT_LEASE_TTL_S


def table(results: Sequence[GroupResult], lease_ttl_s: int) -> list[str]:
    goal = goal_s(lease_ttl_s)
    kills = max(len(result.failovers) for result in results)
    width = max(len("group"), *(len(result.label) for result in results))
    header = f"{'group':<{width}}" + "".join(f"{f'kill {k}':>9}" for k in range(1, kills + 1))
    header += f"{'p50 s':>9}{'max s':>9}   goal"
    lines = [header, "-" * len(header)]
    for result in results:
        seconds = result.failovers
        worst = max(seconds)
        verdict = "met" if worst <= goal else "missed"
        lines.append(
            f"{result.label:<{width}}"
            + "".join(f"{s:>9.2f}" for s in seconds)
            + f"{statistics.median(seconds):>9.2f}{worst:>9.2f}   <= {goal:g} s: {verdict}"
        )
    return lines


def measure(arguments: argparse.Namespace) -> None:
    """Run both groups and print the table (stdout); every process and file gone after."""
    load_before = load_average()
    shared_etcd = bool(load_settings(InfraSettings).etcd_endpoints)
    markets_file = load_settings(
        CatalogSetting, overrides={"markets_file": arguments.markets_file}
    ).markets_file
    if shared_etcd:
        matcher_keys = GroupKeys.of(BENCH_MESH_ID, "matcher", arguments.matcher_group)
        _progress(
            f"warning: OMS_ETCD_ENDPOINTS is set: the groups run there as mesh "
            f"{BENCH_MESH_ID} (matcher {arguments.matcher_group}: "
            f"{matcher_keys.prefix.decode()}): the "
            "benchmark refuses a group that already has keys there, and deletes its own "
            "groups' keys at the end"
        )
    plans, market = plan_groups(arguments, markets_file)
    root = Path(tempfile.mkdtemp(prefix="oms-bench-failover-"))
    groups: list[ReplicaGroup] = []
    try:
        with etcd_for_bench(root) as etcd:
            try:
                results = uvloop.run(
                    run_groups(
                        arguments,
                        plans,
                        market,
                        root=root,
                        etcd=etcd,
                        shared_etcd=shared_etcd,
                        groups=groups,
                    )
                )
            finally:
                # Whatever the loop could not stop (an interrupt at the wrong moment),
                # before the etcd the replicas hold leases in goes away.
                for group in groups:
                    group.stop()
        # The embedded etcd's folder is gone with the run's: say what it was, not where.
        where = etcd.description if shared_etcd else "an embedded etcd, fsync on"
        print(
            "SIGKILL of a group's leader -> the first command the new leader acknowledged, "
            f"in seconds; {REPLICAS} replicas per group, lease {arguments.lease_ttl_s} s, "
            f"{CALLERS} callers each; {where}"
        )
        for line in table(results, arguments.lease_ttl_s):
            print(line)
        print(
            f"goal: at most {GOAL_S:g} s with a {DEFAULT_LEASE_TTL_S} s lease "
            "(the lease's expiry, an election, the clients' reconnect)"
        )
        print(machine_line(load_before), flush=True)
    finally:
        for group in groups:
            group.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(arguments: argparse.Namespace) -> int:
    return run_measured("failover", measure, arguments)


def run_measured(
    name: str, measured: Callable[[argparse.Namespace], None], arguments: argparse.Namespace
) -> int:
    """`oms bench <name>` over replica groups: its exit status and its one-line errors."""
    # Warnings only, and on stderr: the clients' info lines would break up the table.
    configure_logging(f"bench-{name}", level="WARNING", json_lines=False)
    use_transports(MeshTransport.plaintext(), ClientTransport(tls=False))
    try:
        measured(arguments)
    except (FailoverBenchError, MarketCatalogError) as error:
        print(f"oms bench {name}: {error}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl-C or SIGTERM: the run was cancelled, and cleaned up on the way out.
        print(f"oms bench {name}: interrupted; every replica stopped", file=sys.stderr)
        return 130
    return 0
