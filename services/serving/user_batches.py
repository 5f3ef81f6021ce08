"""The cap on queries that ask about many users at once (`GetActorBatch`,
`GetOpenOrderBatch`): one place, so servers refuse and callers chunk alike."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

MAX_USERS_PER_QUERY = 1_000


def user_batch_problem(user_ids: Sequence[int]) -> str | None:
    """Why a batch query's user ids are refused (INVALID_ARGUMENT), or None."""
    if len(user_ids) > MAX_USERS_PER_QUERY:
        return f"{len(user_ids)} user ids in one query (at most {MAX_USERS_PER_QUERY})"
    return None


def user_chunks(user_ids: Sequence[int]) -> Iterator[Sequence[int]]:
    """The ids in queries of at most the cap each, in order."""
    for start in range(0, len(user_ids), MAX_USERS_PER_QUERY):
        yield user_ids[start : start + MAX_USERS_PER_QUERY]
