"""How the shard and the matcher admit a call that carries a leader-only writer's token
(`services/coordination/writer_tokens.py`): once when the call opens, against etcd, and
before each of its batches, against the newest term admitted since."""

from __future__ import annotations

from typing import Any

import grpc
import structlog

from services.coordination.errors import CoordinationUnavailable
from services.coordination.writer_tokens import (
    WriterFenced,
    WriterFences,
    WriterToken,
    WriterTokenError,
)

log = structlog.get_logger(__name__)


async def admit_writer(
    fences: WriterFences, context: grpc.aio.ServicerContext[Any, Any]
) -> WriterToken | None:
    """The call's token once admitted (None: the call carries none); the call is ended
    with FAILED_PRECONDITION for a term that is over, UNAVAILABLE if etcd cannot say."""
    try:
        token = WriterToken.of_call(context.invocation_metadata())
        if token is not None:
            await fences.admit(token)
        return token
    except WriterTokenError as error:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
    except WriterFenced as error:
        log.warning("writer.fenced", reason=str(error))
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
    except CoordinationUnavailable as error:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot check the writer: {error}")
    raise AssertionError("abort() raises")


def superseded(fences: WriterFences, token: WriterToken | None) -> WriterFenced | None:
    """Before each batch: why the call's term is over, if a newer one was admitted since."""
    if token is None:
        return None
    try:
        fences.check(token)
    except WriterFenced as error:
        log.warning("writer.fenced", reason=str(error))
        return error
    return None
