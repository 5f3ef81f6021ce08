"""Funding: deposits and withdrawals, idempotent by transfer id.

A transfer moves value across the shard's boundary (the "external" side of the
ledger). The same transfer id again returns the original result; the same id
with different content is refused DUPLICATE_TRANSFER. Transfer ids are kept
per user for the dedup horizon and flushed with the user's state (under
`user_state.TRANSFER_PREFIX`), so a retry after an eviction is still caught.
Withdrawals only take available funds (total minus reservations).
"""

from __future__ import annotations

from services.shard.core.actor import QUARANTINED, UserActor
from services.shard.core.commands import Deposit, Withdraw
from services.shard.core.dedup import remember, within_horizon
from services.shard.core.egress import (
    EXTERNAL_ACCOUNT,
    USER_ACCOUNT,
    Egress,
    LedgerPosting,
    ShardResult,
)
from services.shard.core.reservations import available
from services.shard.core.saga import refused
from services.shard.core.shard_state import ShardState
from services.shard.core.vocabulary import INT64_MAX, RejectReason

_DEPOSIT = "deposit"
_WITHDRAW = "withdraw"


def transfer_fingerprint(kind: str, asset: str, amount: int) -> str:
    return f"{kind}|{asset}|{amount}"


class Funding:
    def __init__(self, state: ShardState) -> None:
        self.state = state
        self.horizon_ms = state.settings.dedup_horizon_ms
        self.max_transfers = state.settings.max_transfers_per_user

    def transfer_problem(self, command: Deposit | Withdraw) -> int:
        if not command.transfer_id or not command.transfer_id.isprintable():
            return RejectReason.MALFORMED
        if command.asset not in self.state.assets:
            return RejectReason.UNKNOWN_ASSET
        if not 0 < command.amount <= INT64_MAX:
            return RejectReason.INVALID_AMOUNT
        return 0

    def deposit(self, actor: UserActor, command: Deposit, now_ms: int, out: list[Egress]) -> None:
        # Deposits are accepted even for a halted user: money arriving must land.
        if self._answered_before(actor, command, _DEPOSIT, now_ms, out):
            return
        asset = command.asset
        amount = command.amount
        if actor.balances.get(asset, 0) + amount > INT64_MAX:
            out.append(refused(command.correlation_id, RejectReason.INVALID_AMOUNT))
            return
        state = self.state
        state.credit(actor, asset, amount)
        state.accounts.deposits[asset] += amount
        self._record(actor, command, _DEPOSIT, now_ms, out)
        rows = ((actor.user_id, USER_ACCOUNT, asset, amount), (0, EXTERNAL_ACCOUNT, asset, -amount))
        out.append(LedgerPosting(command.transfer_id, rows))

    def withdraw(self, actor: UserActor, command: Withdraw, now_ms: int, out: list[Egress]) -> None:
        if self._answered_before(actor, command, _WITHDRAW, now_ms, out):
            return
        if actor.health:
            out.append(
                refused(
                    command.correlation_id,
                    RejectReason.USER_HALTED,
                    actor.health == QUARANTINED,
                )
            )
            return
        if actor.trading_halted:
            self.state.counters.refused_trading_halted += 1
            out.append(refused(command.correlation_id, RejectReason.TRADING_HALTED))
            return
        asset = command.asset
        amount = command.amount
        if available(actor, asset) < amount:
            out.append(refused(command.correlation_id, RejectReason.INSUFFICIENT_FUNDS))
            return
        state = self.state
        state.debit(actor, asset, amount)
        state.accounts.withdrawals[asset] += amount
        self._record(actor, command, _WITHDRAW, now_ms, out)
        rows = ((actor.user_id, USER_ACCOUNT, asset, -amount), (0, EXTERNAL_ACCOUNT, asset, amount))
        out.append(LedgerPosting(command.transfer_id, rows))

    def _answered_before(
        self,
        actor: UserActor,
        command: Deposit | Withdraw,
        kind: str,
        now_ms: int,
        out: list[Egress],
    ) -> bool:
        original = actor.transfers.get(command.transfer_id)
        if original is None or not within_horizon(original, now_ms, self.horizon_ms):
            return False
        self.state.counters.transfers_duplicate += 1
        if original[0] == transfer_fingerprint(kind, command.asset, command.amount):
            out.append(ShardResult(command.correlation_id, True, 0, 0, False, True, "", 0, False))
        else:
            out.append(refused(command.correlation_id, RejectReason.DUPLICATE_TRANSFER))
        return True

    def _record(
        self,
        actor: UserActor,
        command: Deposit | Withdraw,
        kind: str,
        now_ms: int,
        out: list[Egress],
    ) -> None:
        fingerprint = transfer_fingerprint(kind, command.asset, command.amount)
        remember(
            actor.transfers,
            command.transfer_id,
            (fingerprint, 0, now_ms),
            now_ms - self.horizon_ms,
            self.max_transfers,
        )
        state = self.state
        state.touch(actor, now_ms)
        state.counters.transfers_applied += 1
        out.append(ShardResult(command.correlation_id, True, 0, 0, False, False, "", 0, False))
