"""The PostgreSQL adapter: the only module of the persister that imports asyncpg.

`Store` is a connection pool; `transaction()` lends one connection inside a
transaction as a `Session`, `savepoint()` nests one. Every asyncpg or socket
error leaves this module as one of `persister.errors` (`StoreUnavailable`,
`ConflictError`, `RowRejected`, `StoreError`), so SQL lives with the code that
means it and the error handling speaks our words. Rows come back as plain dicts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, Final, Protocol

import asyncpg

from persister.errors import (
    ConflictError,
    RowRejected,
    StoreError,
    StoreUnavailable,
    WriterFencedError,
)

Row = dict[str, Any]
COMMAND_TIMEOUT_S = 30.0


# Raised by the database when a write carries a writer token that is no longer the
# shard's (migration 0007's `oms_write_rows`).
FENCED_SQLSTATE = "OMSWF"


def translate(error: BaseException) -> StoreError | WriterFencedError:
    """Our error for an asyncpg (or socket) error."""
    constraint = str(getattr(error, "constraint_name", "") or "")
    message = f"{type(error).__name__}: {error}"
    if getattr(error, "sqlstate", None) == FENCED_SQLSTATE:
        return WriterFencedError(str(error))
    if isinstance(error, asyncpg.UniqueViolationError | asyncpg.ExclusionViolationError):
        return ConflictError(message, constraint)
    if isinstance(
        error,
        asyncpg.IntegrityConstraintViolationError
        | asyncpg.DataError
        | asyncpg.exceptions.RaiseError,
    ):
        return RowRejected(message, constraint)
    if isinstance(
        error,
        asyncpg.PostgresConnectionError
        | asyncpg.InterfaceError
        # A connection whose protocol a broken call left mid-operation ("another
        # operation is in progress"): seen after a server crash; the session that met
        # it is ended (`_ending_broken`), so a retry gets a fresh one.
        | asyncpg.InternalClientError
        | asyncpg.exceptions.OperatorInterventionError
        | asyncpg.exceptions.InsufficientResourcesError
        | asyncpg.exceptions.TransactionRollbackError
        | OSError
        | TimeoutError,
    ):
        return StoreUnavailable(message)
    return StoreError(message)


_TRANSLATED = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except _TRANSLATED as error:
        raise translate(error) from error


class RoundTrips:
    """What the persister asked of PostgreSQL: round trips (a statement, a BEGIN, a
    COMMIT or ROLLBACK, a savepoint's two) and transactions. `oms bench e2e` divides
    them by the orders of a phase."""

    __slots__ = ("round_trips", "transactions")

    def __init__(self) -> None:
        self.round_trips = 0
        self.transactions = 0


class Session:
    """One pooled connection, lent for a unit of work."""

    def __init__(self, connection: Any, counts: RoundTrips) -> None:
        self._connection = connection
        self._counts = counts

    async def execute(self, sql: str, *arguments: Any) -> str:
        self._counts.round_trips += 1
        with _translated():
            return str(await self._connection.execute(sql, *arguments))

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._counts.round_trips += 1  # asyncpg pipelines the rows: one wait for them all
        with _translated():
            await self._connection.executemany(sql, rows)

    async def fetch(self, sql: str, *arguments: Any) -> list[Row]:
        self._counts.round_trips += 1
        with _translated():
            records = await self._connection.fetch(sql, *arguments)
        return [dict(record.items()) for record in records]

    async def fetchrow(self, sql: str, *arguments: Any) -> Row | None:
        self._counts.round_trips += 1
        with _translated():
            record = await self._connection.fetchrow(sql, *arguments)
        return None if record is None else dict(record.items())

    async def fetchval(self, sql: str, *arguments: Any) -> Any:
        self._counts.round_trips += 1
        with _translated():
            return await self._connection.fetchval(sql, *arguments)

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """A nested transaction: an error inside rolls back to here and propagates."""
        self._counts.round_trips += 2
        with _translated():
            async with self._connection.transaction():
                yield


# Every statement planned for its own arguments. A session's prepared statements
# otherwise switch to a generic plan after five runs and keep it for the session: the
# write-behind's UPDATE of `orders` joined to the batch's `unnest` arrays got a
# sequential scan and hash join while `orders` was young and small, and kept it as the
# table grew, so each transaction read every order (in `oms bench e2e` at 1,000
# orders/s: one scan of all of `orders` per transaction, and PostgreSQL's CPU per order
# rising with the table). Planning each time costs tens of µs a statement; the scans it
# prevents grow without bound. `oms_write_rows`, the usual write, sets its own: cached
# plans with sequential scans priced out (migration 0008), cheaper than planning.
SESSION_SETTINGS: Final = {"plan_cache_mode": "force_custom_plan"}


class FenceCheck(Protocol):
    async def check(self, session: Session) -> None: ...


async def _keep_session_as_it_is(connection: asyncpg.Connection) -> None:
    """The pool's default reset (`RESET ALL`, `UNLISTEN *`, unlock every advisory lock)
    is a round trip on every release, as long as a short read itself. The persister
    keeps no session state: no SET, LISTEN or cursor, and its one session advisory
    lock (`shard_lock.py`) is held by a session it never gives back until it unlocks.
    asyncpg still ends a transaction left open before this runs."""


# Failures of the connection itself, not of a statement the server refused (a
# serialization failure, say, leaves a connection as good as it was).
_CONNECTION_FAILURES = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
    OSError,
    TimeoutError,
)


@contextlib.asynccontextmanager
async def _ending_broken(connection: Any) -> AsyncIterator[None]:
    """A connection that failed as a connection (not a statement the server refused)
    is closed before the pool takes it back: the pool would otherwise lend it again,
    and after a server crash asyncpg was seen to lend one still mid-call."""
    try:
        yield
    except BaseException as error:
        cause: BaseException | None = error
        while cause is not None:  # the original error, under our translation of it
            if isinstance(cause, _CONNECTION_FAILURES):
                connection.terminate()
                break
            cause = cause.__cause__
        raise


class Store:
    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.counts = RoundTrips()
        # Set once this persister claimed its shard (`persister.writer_fence`): every
        # transaction then first checks that no newer writer has claimed it since.
        self.fence: FenceCheck | None = None

    @classmethod
    async def open(cls, url: str, *, pool_size: int) -> Store:
        with _translated():
            pool = await asyncpg.create_pool(
                url,
                min_size=1,
                max_size=pool_size,
                command_timeout=COMMAND_TIMEOUT_S,
                reset=_keep_session_as_it_is,
                server_settings=SESSION_SETTINGS,
            )
        return cls(pool)

    @classmethod
    async def open_when_ready(cls, url: str, *, pool_size: int, timeout_s: float) -> Store:
        """Open the pool, retrying while the server is not up yet (e.g. under `oms up`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay_s = 0.1
        while True:
            try:
                return await cls.open(url, pool_size=pool_size)
            except StoreUnavailable:
                if loop.time() + delay_s > deadline:
                    raise
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A connection without an explicit transaction (each statement commits)."""
        with _translated():
            async with self._pool.acquire() as connection, _ending_broken(connection):
                yield Session(connection, self.counts)

    async def one_statement(self, sql: str, *arguments: Any) -> Row | None:
        """One statement, its own transaction (a function that writes, say): one round
        trip, no BEGIN or COMMIT of its own."""
        self.counts.transactions += 1
        async with self.session() as session:
            return await session.fetchrow(sql, *arguments)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Session]:
        """A connection inside one transaction: committed on exit, rolled back on error."""
        with _translated():
            self.counts.transactions += 1
            self.counts.round_trips += 2  # BEGIN, then COMMIT or ROLLBACK
            async with (
                self._pool.acquire() as connection,
                _ending_broken(connection),
                connection.transaction(),
            ):
                session = Session(connection, self.counts)
                if self.fence is not None:
                    await self.fence.check(session)
                yield session

    async def close(self) -> None:
        with contextlib.suppress(*_TRANSLATED):
            async with asyncio.timeout(5.0):
                await self._pool.close()
        self._pool.terminate()
