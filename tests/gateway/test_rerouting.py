"""What the gateway does after NOT_OWNER (`gateway/core/rerouting.py`), for every case
its router and the simulation meet."""

from __future__ import annotations

import pytest

from gateway.core.rerouting import NotOwnerStep, after_not_owner


@pytest.mark.parametrize(
    ("shard_epoch", "routed_epoch", "budget_spent", "step"),
    [
        # The shard has not logged the epoch the gateway routed by: ask it again.
        (4, 5, False, NotOwnerStep.ASK_AGAIN),
        # The shard decided under a newer epoch: route again once the gateway has it.
        (6, 5, False, NotOwnerStep.AWAIT_NEWER_EPOCH),
        # The same epoch, yet not the owner (the user is leaving it): wait for the next.
        (5, 5, False, NotOwnerStep.AWAIT_NEWER_EPOCH),
        # Past the re-routing budget, whatever the epochs: the client hears NOT_OWNER.
        (4, 5, True, NotOwnerStep.ANSWER),
        (6, 5, True, NotOwnerStep.ANSWER),
    ],
)
def test_the_step_after_not_owner(
    shard_epoch: int, routed_epoch: int, budget_spent: bool, step: NotOwnerStep
) -> None:
    assert (
        after_not_owner(
            shard_epoch=shard_epoch, routed_epoch=routed_epoch, budget_spent=budget_spent
        )
        is step
    )
