"""Asking every process for its `oms.v1.Status` at once, each within one deadline.

A process that does not answer in time (stopped, partitioned, gone) is reported as
such; the table never waits longer than the deadline for it. The mesh's services
are reached as the mesh reaches them (`mesh_channel`: mutual TLS with the local
tools' identity when the mesh has TLS), a gateway as a client does (its public
port, TLS checked by the authority); status and health need no signature.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from functools import partial

import grpc

from protos.oms.v1 import status_pb2, status_pb2_grpc
from services.clients.call_failures import call_failure
from services.clients.channels import service_channel
from services.mesh.status_rows import ProcessReport, ProcessTarget

DEFAULT_TIMEOUT_S = 1.0


async def probe_all(
    targets: Sequence[ProcessTarget], timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[ProcessReport]:
    """Every target's report (or failure), in the targets' order."""
    return list(await asyncio.gather(*(probe(target, timeout_s) for target in targets)))


async def probe(target: ProcessTarget, timeout_s: float) -> ProcessReport:
    open_channel = partial(service_channel, target.service)
    started = time.monotonic()
    try:
        async with open_channel(target.address) as channel:
            report: status_pb2.StatusReport = await status_pb2_grpc.StatusStub(channel).GetStatus(
                status_pb2.StatusRequest(), timeout=timeout_s
            )
    except grpc.aio.AioRpcError as error:
        waited_s = time.monotonic() - started
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return ProcessReport(target, failure=f"no answer within {waited_s:.1f} s")
        return ProcessReport(target, failure=f"no answer: {call_failure(error, timeout_s)}")
    except (OSError, ValueError) as error:  # an address that does not parse or resolve
        return ProcessReport(target, failure=f"no answer: {error}")
    return ProcessReport(target, dict(report.counters), dict(report.info))
