"""One thread that runs a log's blocking work in submission order.

`ThreadPoolExecutor` + `run_in_executor` does the same job with more Python on
the path of every append: a work item, a concurrent future with its own lock
and callbacks, a chained asyncio future. Each of those steps needs the GIL,
which the event loop holds while it applies the batch being written, so the
write started late. Measured with `oms bench runtime` at 20,000 entries/s:
submit to write start 390 to 460 µs at the median through the executor, 280 to
330 µs here, and 0.15 to 0.2 ms off the median append-to-durable latency.

The hand-off is a deque and a lock used as a wake-up signal: the thread drains
every queued job each time it wakes, so a release that finds the lock already
open loses nothing.

The write still tends to start only when the loop next sleeps, after the batch
is applied: Linux queues the woken thread on its waker's CPU. `os.sched_yield()`
after the wake-up fixes that when the core is otherwise free, but it hands the
core to any runnable process, and with the whole mesh on two cores it doubled to
tripled the stream's p99, so it is not done here (README, runtime figures).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

ResultT = TypeVar("ResultT")

_Job = tuple[Callable[..., Any], tuple[object, ...], asyncio.Future[Any], asyncio.AbstractEventLoop]


class WriterThread:
    def __init__(self, name: str) -> None:
        self._jobs: deque[_Job | None] = deque()
        self._wake = threading.Lock()
        self._wake.acquire()
        self._stopped = False
        self._name = name
        self._thread: threading.Thread | None = None  # started by the first submission

    def submit(
        self, function: Callable[..., ResultT], *arguments: object
    ) -> asyncio.Future[ResultT]:
        """Queue `function(*arguments)`; its result arrives on the calling loop's future."""
        if self._stopped:
            raise RuntimeError("writer thread is stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResultT] = loop.create_future()
        if self._thread is None:
            # A daemon: a store nobody closed must not keep the process alive. Work is
            # acknowledged only after it returns, so dying mid-write loses nothing acked.
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.append((function, arguments, future, loop))
        self._signal()
        return future

    def stop(self) -> None:
        """Finish what is queued, then end the thread; returns once it has ended."""
        if not self._stopped:
            self._stopped = True
            self._jobs.append(None)
            self._signal()
        if self._thread is not None:
            self._thread.join()

    def _signal(self) -> None:
        # try/except rather than contextlib.suppress: this runs on every append.
        try:  # noqa: SIM105
            self._wake.release()
        except RuntimeError:
            pass  # already signalled: the thread drains everything queued when it wakes

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            self._wake.acquire()
            while jobs:
                job = jobs.popleft()
                if job is None:
                    return
                function, arguments, future, loop = job
                try:
                    result = function(*arguments)
                except BaseException as error:  # handed to the awaiting caller
                    _post(loop, future, None, error)
                else:
                    _post(loop, future, result, None)


def _post(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: object,
    error: BaseException | None,
) -> None:
    try:  # noqa: SIM105 (every append passes here; suppress() adds a context manager)
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:
        pass  # the loop is closed: nobody is left to await the answer


def _settle(future: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if future.done():
        return  # cancelled by its awaiter meanwhile
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
