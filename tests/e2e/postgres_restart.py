"""Start a test's PostgreSQL again on its data folder, from a process of its own.

    python -m tests.e2e.postgres_restart DATA_DIR PORT

starts the server, waits until it accepts queries, prints `ready <pid>`, then stays
as its parent until it exits (and reaps it: a zombie postmaster would hold its
socket's lock file against the next start); SIGTERM asks it for a fast shutdown. A test
under load starts PostgreSQL through this rather than itself: starting it forks to
change user, and a fork of a process whose gRPC threads are busy once died of SIGSEGV
(tests/e2e/test_database_outage.py); this process has no such threads.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

from services.infra.embedded_postgres import EmbeddedPostgres


def main(arguments: list[str]) -> int:
    data_dir, port = Path(arguments[0]), int(arguments[1])
    postgres = EmbeddedPostgres(data_dir, port=port)  # fsync on: a durable server

    def stop(number: int, frame: FrameType | None) -> None:
        if postgres.pid is not None:
            os.kill(postgres.pid, signal.SIGINT)  # fast shutdown; `wait` below returns

    signal.signal(signal.SIGTERM, stop)
    postgres.start()
    print(f"ready {postgres.pid}", flush=True)
    return postgres.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
