"""The next release, as an upgrade test builds it: this code plus one state-machine version
more for the shard (`SHARD_VERSION`) and for the matcher (`MATCHER_VERSION`), each one past
the newest this build implements (4 and 3 today).

Run as `python -m tests.upgrade.next_release <oms subcommand> ...` (a replica restarted
"on new code"). It implements this build's versions and those, and keeps the older
decisions until the group's log activates the new version:

- the shard, `SHARD_VERSION`: a single deposit above `DEPOSIT_CAP` is refused
  INVALID_AMOUNT (a new rule; a retry of a deposit already accepted is still answered
  as before, whatever its size);
- the matcher, `MATCHER_VERSION`: a limit order over `MAX_ORDER_LOTS` is rejected
  INVALID_ORDER (a new maximum order size; a resubmission of an order it knows is
  still answered as before).

Nothing here is imported by the services: a build that has not loaded this module
implements version 1 only, as the release before would.
"""

from __future__ import annotations

import sys

from services.matcher.core import engine
from services.matcher.core import versions as matcher_versions
from services.matcher.core.commands import CommandResult, SubmitCommand
from services.matcher.core.engine_state import EngineState
from services.matcher.core.event_log import EventRecord
from services.matcher.core.orders import LIMIT
from services.matcher.core.validation import INVALID_ORDER
from services.shard.core import versions as shard_versions
from services.shard.core.actor import UserActor
from services.shard.core.balances import _DEPOSIT, Funding
from services.shard.core.commands import Deposit
from services.shard.core.egress import Egress
from services.shard.core.saga import refused
from services.shard.core.vocabulary import RejectReason

DEPOSIT_CAP = 1_000_000
MAX_ORDER_LOTS = 100_000
# Computed, so a version added to the services moves these along with no test to edit.
SHARD_VERSION = max(shard_versions.IMPLEMENTED_VERSIONS) + 1
MATCHER_VERSION = max(matcher_versions.IMPLEMENTED_VERSIONS) + 1
THIS_BUILD_SHARD_VERSIONS = shard_versions.IMPLEMENTED_VERSIONS
THIS_BUILD_MATCHER_VERSIONS = matcher_versions.IMPLEMENTED_VERSIONS
_deposit_before = Funding.deposit
_submit_before = engine.submit  # type: ignore[attr-defined]


def _deposit(
    self: Funding, actor: UserActor, command: Deposit, now_ms: int, out: list[Egress]
) -> None:
    if self.state.machine_version >= SHARD_VERSION and command.amount > DEPOSIT_CAP:
        if self._answered_before(actor, command, _DEPOSIT, now_ms, out):
            return
        out.append(refused(command.correlation_id, RejectReason.INVALID_AMOUNT))
        return
    _deposit_before(self, actor, command, now_ms, out)


def _submit(
    state: EngineState, command: SubmitCommand, now: int, events: list[EventRecord]
) -> CommandResult:
    spec = command.spec
    if (
        state.machine_version >= MATCHER_VERSION
        and spec.order_type == LIMIT
        and spec.quantity_lots > MAX_ORDER_LOTS
        and spec.user_seq
        and spec.order_id not in state.dedup.orders
        and spec.symbol in state.books
    ):
        return state.reject(command.correlation_id, spec, INVALID_ORDER, now, events)
    return _submit_before(state, command, now, events)


def install() -> None:
    shard_versions.IMPLEMENTED_VERSIONS = THIS_BUILD_SHARD_VERSIONS | {SHARD_VERSION}
    matcher_versions.IMPLEMENTED_VERSIONS = THIS_BUILD_MATCHER_VERSIONS | {MATCHER_VERSION}
    Funding.deposit = _deposit  # type: ignore[method-assign]
    # The engine calls `submit` by its own module's name for it.
    engine.submit = _submit  # type: ignore[attr-defined]


if __name__ == "__main__":
    install()
    from services.command_line import main

    sys.exit(main())
