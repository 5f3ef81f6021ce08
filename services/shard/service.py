"""The user shard service: the shard state machine on the runtime, behind gRPC.

- Execute: serialized `ShardCommandBatch` bytes go straight into the log (one
  entry per batch, up to `max_inflight_batches` in flight per stream); each
  entry's results come back once durable. A command that had to wait
  (hydration, database dedup answer) is answered `parked`, then finally on the
  same stream when the entry that decides it is durable (`ResultRouter`).
- SubscribeEgress: durable egress from a log position, filtered by kind; the
  persister and the bridge resume from the position after their last one.
- GetInFlight: the bridge's work queue (every saga in flight) at a durable position.
- PublishMarks: ticks into the conflating mailbox; a loop logs one MarkPrices
  command per `mark_interval_ms` with the newest price of each symbol.
- GetActor / GetStatus / ListUsers: operator and reconciler queries, answered once
  applied == durable.
A monitor loop raises a saturation alert (log event and counter) whenever the
longest queue dwell of the last second passes `saturation_dwell_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from protos.oms.v1 import shard_pb2
from services.clients.shard_link import STREAM_OPENED_KEY, STREAM_OPENED_VALUE
from services.coordination.group_keys import DEFAULT_MESH_ID
from services.coordination.writer_tokens import WriterFenced, WriterFences
from services.observability.tracing import context_of, tracer, tracing_enabled
from services.runtime.egress_feed import EgressWindowExceededError
from services.runtime.hosting import HostPlan, RuntimeHost
from services.runtime.upgrades import start_new_log_at
from services.serving.user_batches import user_batch_problem
from services.serving.writer_admission import admit_writer, superseded
from services.shard.actor_view import actor_view
from services.shard.core.actor import UserActor
from services.shard.core.codec import egress_to_protobufs
from services.shard.core.egress import ShardResult, SubmitToMatcher
from services.shard.core.shard_machine import ShardMachine
from services.shard.egress_frames import EgressBatchView, EgressFrames, EgressSelection
from services.shard.result_router import ResultRouter, Stamped
from services.shard.routing_feed import RoutingFeed
from services.shard.settlement_traces import SettlementTraces
from services.shard.tick_mailbox import MarkCadence, TickMailbox

log = structlog.get_logger(__name__)
_tracer = tracer(__name__)
SERVICE_NAME = "oms.v1.UserShard"
FINALS_GRACE_S = 30.0
MAX_USER_PAGE = 10_000
Egress = Any  # the union of core egress records


class ShardServicer:
    def __init__(
        self,
        host: RuntimeHost[Egress],
        *,
        shard_id: str,
        max_inflight_batches: int,
        mark_interval_ms: int,
        saturation_dwell_ms: int,
        fences: WriterFences,
        etcd_endpoints: Sequence[str] = (),
        mesh_id: str = DEFAULT_MESH_ID,
        version_at_start: int = 0,
    ) -> None:
        self.host = host
        self.version_at_start = version_at_start
        # Made before the host's sequencer runs: an empty log now is a new group's.
        self.new_log = host.node.replica.applied_position == 0
        self.fences = fences  # the bridge's and the reconciler's terms (tokens on Execute)
        self.machine: ShardMachine = host.node.replica.machine  # type: ignore[assignment]
        self.shard_id = shard_id
        self.max_inflight_batches = max_inflight_batches
        self.mark_interval_ms = mark_interval_ms
        self.saturation_dwell_ms = saturation_dwell_ms
        self.router = ResultRouter()
        self.marks = TickMailbox()
        self.mark_cadence = MarkCadence()
        # Sampled orders' fills traced on their way back (only with an exporter).
        self.frames = EgressFrames(traces=SettlementTraces() if tracing_enabled() else None)
        self.saturation_alerts = 0
        # With etcd, the leader logs each newer routing document (services/routing).
        self.routing = (
            RoutingFeed(etcd_endpoints, mesh_id, lambda: host.ingress, self._routing_epoch)
            if etcd_endpoints
            else None
        )

    def _routing_epoch(self) -> int:
        routing = self.machine.state.routing
        return 0 if routing is None else routing.epoch

    # --- Execute ---------------------------------------------------------------------

    async def execute(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        # A leader-only writer's term is checked first (one etcd read, at most
        # ETCD_TIMEOUT_S); then the stream's opening is answered at once: a `ShardLink`
        # counts the shard as reachable only once it has seen these headers
        # (services/clients/shard_link.py).
        writer = await admit_writer(self.fences, context)
        await context.send_initial_metadata(((STREAM_OPENED_KEY, STREAM_OPENED_VALUE),))
        ingress = self.host.ingress
        fenced: list[WriterFenced] = []
        window: asyncio.Queue[tuple[asyncio.Future[Any], bytes] | None] = asyncio.Queue(
            self.max_inflight_batches
        )
        finals: asyncio.Queue[Stamped] = asyncio.Queue()
        outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()
        outstanding = 0
        expected: dict[int, None] = {}  # correlation ids parked on this stream
        settled = asyncio.Event()
        settled.set()

        async def read_ahead() -> None:
            try:
                async for payload in requests:
                    if refusal := superseded(self.fences, writer):
                        fenced.append(refusal)  # a newer term writes now: nothing more
                        break
                    # In turn, so one stream's batches keep their order in the log.
                    await window.put((await ingress.enqueue(payload), payload))
            finally:
                await window.put(None)

        async def answer_entries() -> None:
            nonlocal outstanding
            while (submitted := await window.get()) is not None:
                receipt_of, payload = submitted
                receipt = await receipt_of
                position, time_ms = receipt.first_position, receipt.consensus_time_ms
                own: frozenset[int] | None = None
                results: list[Stamped] = []
                for item in receipt.outputs[0]:
                    if not isinstance(item, ShardResult):
                        continue
                    if item.parked:
                        outstanding += 1
                        settled.clear()
                        expected[item.correlation_id] = None
                        self.router.expect(item.correlation_id, finals)
                    elif item.correlation_id in expected:
                        continue  # a final this stream waits for: the router delivers it
                    else:
                        # A HydrateUser or DedupAnswer in this entry releases commands that
                        # other streams sent: their finals go there (router), not here.
                        if own is None:
                            own = _correlation_ids(payload)
                        if item.correlation_id not in own:
                            continue
                    results.append((item, position, time_ms))
                if results:
                    await outgoing.put(self._result_batch(results))

        async def answer_finals() -> None:
            nonlocal outstanding
            while True:
                results = [await finals.get()]
                while not finals.empty():
                    results.append(finals.get_nowait())
                for result, _, _ in results:
                    expected.pop(result.correlation_id, None)
                outstanding -= len(results)
                if outstanding <= 0:
                    settled.set()
                await outgoing.put(self._result_batch(results))

        async def pump() -> None:
            async with asyncio.TaskGroup() as group:
                group.create_task(read_ahead())
                entries = group.create_task(answer_entries())
                late = group.create_task(answer_finals())
                await entries
                # The client closed its side: parked commands still get their answer,
                # for a bounded time (after that the client retries; dedup answers).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FINALS_GRACE_S):
                        await settled.wait()
                late.cancel()
            await outgoing.put(None)

        pumping = asyncio.create_task(pump())
        try:
            while (message := await outgoing.get()) is not None:
                yield message
            await pumping
            if fenced:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(fenced[0]))
        finally:
            pumping.cancel()
            self.router.forget(finals)

    def _result_batch(self, results: Sequence[Stamped]) -> bytes:
        batch = shard_pb2.ShardResultBatch()
        for result, position, consensus_time_ms in results:
            for message in egress_to_protobufs(result, position, consensus_time_ms):
                batch.results.append(message.result)
        return batch.SerializeToString()

    # --- egress subscriptions -------------------------------------------------------------

    async def subscribe_egress(
        self, request: shard_pb2.EgressSubscription, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes | EgressBatchView]:
        selection = EgressSelection(
            self.frames,
            from_position=max(1, request.from_position),
            kinds=frozenset(request.kinds),
            order_update_users=frozenset(request.order_update_users),
            urgent_kinds=frozenset(request.urgent_kinds),
            with_through=request.through_positions,
            # A subscriber in this process takes the messages, not their bytes.
            in_process=getattr(context, "in_process", False),
        )
        interval_s = request.min_interval_ms / 1000
        loop = asyncio.get_running_loop()
        records = aiter(self.host.feed.subscribe_batches(selection.from_position))
        upcoming = asyncio.ensure_future(anext(records))
        sent_at = -interval_s
        try:
            while True:
                if selection.has_message():
                    wait_s = sent_at + interval_s - loop.time()
                    if wait_s > 0 and not selection.urgent:
                        await asyncio.wait((upcoming,), timeout=wait_s)
                    if wait_s <= 0 or selection.urgent or not upcoming.done():
                        sent_at = loop.time()
                        yield selection.message()
                        continue
                try:
                    batch = await upcoming
                except StopAsyncIteration:
                    return  # the feed closed: the shard is stopping
                upcoming = asyncio.ensure_future(anext(records))
                for full in selection.add(batch):
                    yield full  # a long catch-up: sent in parts, never held back
                    sent_at = loop.time()
        except EgressWindowExceededError as error:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(error))
        finally:
            upcoming.cancel()

    async def get_in_flight(
        self, request: shard_pb2.InFlightRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> shard_pb2.InFlightSnapshot:
        await self.host.settled()
        position = self.host.node.replica.applied_position
        time_ms = self.host.node.replica.consensus_time_ms
        snapshot = shard_pb2.InFlightSnapshot(as_of_position=position)
        for item in self.machine.in_flight_egress():
            snapshot.items.extend(egress_to_protobufs(item, position, time_ms))
        for group, sequence in self.machine.state.sequences.items():
            snapshot.matcher_sequences[group] = sequence
        return snapshot

    async def list_users(
        self, request: shard_pb2.UserPageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> shard_pb2.UserPage:
        await self.host.settled()
        limit = min(max(request.limit, 1), MAX_USER_PAGE)
        page = resident_user_page(
            self.machine.state.actors, request.after_user_id, limit, request.with_orders_only
        )
        following = page[-1] if len(page) == limit else 0
        return shard_pb2.UserPage(user_ids=page, next_after_user_id=following)

    # --- marks ----------------------------------------------------------------------------

    async def publish_marks(
        self,
        requests: AsyncIterator[shard_pb2.MarkPrices],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> shard_pb2.Empty:
        writer = await admit_writer(self.fences, context)
        async for marks in requests:
            if refusal := superseded(self.fences, writer):
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refusal))
            for mark in marks.prices:
                if mark.price_ticks > 0:
                    self.marks.offer(mark.symbol, mark.price_ticks)
        return shard_pb2.Empty()

    async def log_conflated_marks(self) -> None:
        while True:
            await asyncio.sleep(self.mark_interval_ms / 1000)
            if not self.marks or not self.mark_cadence.due(self.host.ingress.fill_fraction()):
                continue
            drained = self.marks.drain()
            command = shard_pb2.ShardCommand()
            for symbol, price in drained:
                command.mark_prices.prices.add(symbol=symbol, price_ticks=price)
            batch = shard_pb2.ShardCommandBatch(commands=[command])
            await self.host.ingress.submit(batch.SerializeToString())

    # --- queries --------------------------------------------------------------------------

    async def get_actor(
        self, request: shard_pb2.ActorQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> shard_pb2.ActorView:
        await self.host.settled()
        view = actor_view(self.machine, request.user_id, orders_only=request.orders_only)
        view.as_of_position = self.host.node.replica.applied_position
        return view

    async def get_actor_batch(
        self, request: shard_pb2.ActorBatchQuery, context: grpc.aio.ServicerContext[Any, Any]
    ) -> shard_pb2.ActorBatch:
        if problem := user_batch_problem(request.user_ids):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self.host.settled()
        position = self.host.node.replica.applied_position
        batch = shard_pb2.ActorBatch()
        for user_id in request.user_ids:
            view = actor_view(self.machine, user_id)
            view.as_of_position = position
            view.user_id = user_id
            batch.views.append(view)
        return batch

    async def get_status(
        self, request: shard_pb2.ShardStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> shard_pb2.ShardStatus:
        await self.host.settled()
        statistics = self.machine.statistics()
        sequencer = self.host.node.sequencer.statistics()
        status = shard_pb2.ShardStatus(
            shard_id=self.shard_id,
            applied_position=self.host.node.replica.applied_position,
            consensus_time_ms=self.host.node.replica.consensus_time_ms,
            resident_users=statistics.resident_users,
            parked_commands=statistics.parked_commands,
            in_flight_sagas=statistics.in_flight_submits + statistics.in_flight_cancels,
            evictions=_counter(statistics.counters, "evictions"),
            hydrations=_counter(statistics.counters, "hydrations"),
            max_queue_dwell_ms=sequencer.max_queue_dwell_ms,
        )
        for name, value in statistics.counters:
            status.counters[name] = value
        books = self.machine.state.accounts
        for asset, resident in books.resident.items():
            status.accounts.add(
                asset=asset,
                resident=resident,
                clearing=books.clearing[asset],
                fees=books.fees[asset],
                deposits=books.deposits[asset],
                withdrawals=books.withdrawals[asset],
                hydrated_in=books.hydrated_in[asset],
                dehydrated_out=books.dehydrated_out[asset],
            )
        status.counters["saturation_alerts"] = self.saturation_alerts
        status.counters["routing_epoch"] = statistics.routing_epoch
        status.counters["leaving_users"] = statistics.leaving_users
        status.counters["persisted_through"] = statistics.persisted_through
        status.counters["armed_switches"] = statistics.armed_switches
        mailbox = self.marks.statistics()
        status.counters["ticks_received"] = mailbox.received
        status.counters["ticks_conflated"] = mailbox.replaced
        status.counters["mark_batches_deferred"] = self.mark_cadence.deferrals
        return status

    # --- background loops -----------------------------------------------------------------

    async def route_final_results(self) -> None:
        feed = self.host.feed
        async for record in feed.subscribe(feed.durable_position + 1):
            for position, item in record.items:
                if isinstance(item, ShardResult):
                    self.router.route(item, position, record.consensus_time_ms)
                elif isinstance(item, SubmitToMatcher) and item.request.trace_parent:
                    _trace_admission(item, position, record.consensus_time_ms)

    async def watch_saturation(self) -> None:
        sequencer = self.host.node.sequencer
        while True:
            await asyncio.sleep(1.0)
            dwell_ms = sequencer.take_window_max_dwell_ms()
            if dwell_ms > self.saturation_dwell_ms:
                self.saturation_alerts += 1
                log.warning(
                    "shard.saturated",
                    max_queue_dwell_ms=round(dwell_ms, 3),
                    threshold_ms=self.saturation_dwell_ms,
                )

    # --- wiring ---------------------------------------------------------------------------

    def register(self, server: grpc.aio.Server) -> None:
        unary = grpc.unary_unary_rpc_method_handler
        handlers = {
            "Execute": grpc.stream_stream_rpc_method_handler(
                self.execute, request_deserializer=None, response_serializer=None
            ),
            "SubscribeEgress": grpc.unary_stream_rpc_method_handler(
                self.subscribe_egress,
                request_deserializer=shard_pb2.EgressSubscription.FromString,
                response_serializer=None,  # ready wire bytes (EgressFrames)
            ),
            "GetInFlight": unary(
                self.get_in_flight,
                request_deserializer=shard_pb2.InFlightRequest.FromString,
                response_serializer=shard_pb2.InFlightSnapshot.SerializeToString,
            ),
            "PublishMarks": grpc.stream_unary_rpc_method_handler(
                self.publish_marks,
                request_deserializer=shard_pb2.MarkPrices.FromString,
                response_serializer=shard_pb2.Empty.SerializeToString,
            ),
            "GetActor": unary(
                self.get_actor,
                request_deserializer=shard_pb2.ActorQuery.FromString,
                response_serializer=shard_pb2.ActorView.SerializeToString,
            ),
            "GetActorBatch": unary(
                self.get_actor_batch,
                request_deserializer=shard_pb2.ActorBatchQuery.FromString,
                response_serializer=shard_pb2.ActorBatch.SerializeToString,
            ),
            "GetStatus": unary(
                self.get_status,
                request_deserializer=shard_pb2.ShardStatusRequest.FromString,
                response_serializer=shard_pb2.ShardStatus.SerializeToString,
            ),
            "ListUsers": unary(
                self.list_users,
                request_deserializer=shard_pb2.UserPageRequest.FromString,
                response_serializer=shard_pb2.UserPage.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )

    def plan(self) -> HostPlan:
        return HostPlan(
            service_names=(SERVICE_NAME,),
            register=self.register,
            loops=[
                self.route_final_results,
                self.log_conflated_marks,
                self.watch_saturation,
                self.start_new_log,
                *([self.routing.run] if self.routing is not None else []),
            ],
            metrics=[("shard", self.metric_numbers)],
        )

    async def start_new_log(self) -> None:
        """A new group decides under the newest rules from its start (`start_new_log_at`);
        a loop of the plan, so it returns at once where there is nothing to do."""
        if self.new_log:
            await start_new_log_at(self.host, self.version_at_start)

    def metric_numbers(self) -> dict[str, int]:
        """For the metrics endpoint: the actors, sagas and the machine's counters."""
        statistics = self.machine.statistics()
        numbers = {
            name: value
            for name, value in dataclasses.asdict(statistics).items()
            if isinstance(value, int)
        }
        numbers["in_flight_sagas"] = statistics.in_flight_submits + statistics.in_flight_cancels
        numbers.update(statistics.counters)
        numbers["saturation_alerts"] = self.saturation_alerts
        mailbox = self.marks.statistics()
        numbers["ticks_received"] = mailbox.received
        numbers["ticks_conflated"] = mailbox.replaced
        numbers["mark_batches_deferred"] = self.mark_cadence.deferrals
        records, items = self.host.feed.retained
        numbers["egress_retained_records"] = records
        numbers["egress_retained_items"] = items
        numbers["egress_oldest_position"] = self.host.feed.oldest_position
        return numbers


def _correlation_ids(payload: bytes) -> frozenset[int]:
    """The correlation ids a stream's batch carried (0 answers an undecodable batch)."""
    try:
        commands = shard_pb2.ShardCommandBatch.FromString(payload).commands
    except (DecodeError, ValueError):
        return frozenset((0,))
    return frozenset((0, *(command.correlation_id for command in commands)))


def _trace_admission(item: SubmitToMatcher, position: int, consensus_time_ms: int) -> None:
    """A sampled order's span: from its entry's consensus time to its egress being durable."""
    span = _tracer.start_span(
        "shard.admit_order",
        context=context_of(item.request.trace_parent),
        start_time=consensus_time_ms * 1_000_000,
        attributes={
            "oms.order_id": item.order_id,
            "oms.user_id": item.request.user_id,
            "oms.log_position": position,
        },
    )
    span.end()


def resident_user_page(
    actors: Mapping[int, UserActor], after_user_id: int, limit: int, with_orders_only: bool
) -> list[int]:
    """The `limit` smallest resident user ids above `after_user_id`.

    One pass with a bounded heap: O(resident users) per page, run on the loop; the
    reconciler asks for a page every few seconds, so this stays far from the hot path.
    """
    candidates = (
        user_id
        for user_id, actor in actors.items()
        if user_id > after_user_id and (not with_orders_only or actor.orders)
    )
    return heapq.nsmallest(limit, candidates)


def _counter(counters: tuple[tuple[str, int], ...], name: str) -> int:
    for key, value in counters:
        if key == name:
            return value
    return 0
