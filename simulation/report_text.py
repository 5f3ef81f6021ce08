"""What `oms sim` and `oms chaos report` print: one run, or a campaign's figures."""

from __future__ import annotations

from simulation.campaign import CampaignFigures
from simulation.core.faults import FAULT_KINDS
from simulation.core.world import SimConfig, SimResult


def reproduce_command(config: SimConfig) -> str:
    kinds = sorted(config.plan.kinds)
    faults = "all" if kinds == sorted(FAULT_KINDS) else (",".join(kinds) or "none")
    command = f"oms sim --seed {config.seed} --steps {config.steps} --faults {faults}"
    if config.defect:
        command += f" --defect {config.defect}"
    return command


def run_text(config: SimConfig, result: SimResult, *, trace: bool) -> str:
    lines = [
        f"seed {result.seed}: {'ok' if result.ok else 'VIOLATION'}; {result.steps:,} steps,"
        f" {result.simulated_ms / 1000:.1f} s simulated; trace {result.trace_hash},"
        f" final state {result.final_hash}",
        f"  rerun: {reproduce_command(config)}",
        "  faults: " + (", ".join(f"{k} {v}" for k, v in result.faults.items()) or "none"),
        "  clients: " + ", ".join(f"{k} {v:,}" for k, v in result.clients.items()),
        "  mesh: " + ", ".join(f"{k} {v:,}" for k, v in result.figures.items()),
        f"  audit: {result.audit_checks:,} checks, findings {result.audit_findings or 'none'}",
    ]
    for kind, durations in result.leaderless_ms.items():
        if durations:
            lines.append(f"  {kind}: a group without a serving leader (ms): {durations}")
    for violation in result.violations:
        lines.append(
            f"  violation at step {violation.step:,} ({violation.time_ms} ms):"
            f" {violation.kind}: {violation.detail}"
        )
    if trace:
        lines.append("  fault trace (simulated ms, kind, target):")
        lines.extend(f"    {line}" for line in result.trace)
    return "\n".join(lines)


def _spread(values: list[int]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)

    def at(fraction: float) -> int:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    return f"{len(ordered):,} times; p50 {at(0.5):,}, p99 {at(0.99):,}, max {ordered[-1]:,}"


def campaign_markdown(figures: CampaignFigures) -> str:
    last = figures.first_seed + figures.seeds - 1
    clients = figures.clients
    mesh = figures.figures
    failed = sum(len(seeds) for seeds in figures.failed.values())
    violations = (
        "; ".join(
            f"{kind}: {len(seeds):,} seeds, first {seeds[:10]}"
            for kind, seeds in sorted(figures.failed.items())
        )
        or "none"
    )
    rows = [
        (
            "seeds",
            f"{figures.first_seed}..{last} ({figures.seeds:,}): {figures.passed:,} passed,"
            f" {failed:,} failed",
        ),
        (
            "steps",
            f"{figures.steps:,} ({figures.steps_per_seed:,} with faults per seed, then settling)",
        ),
        ("simulated time", f"{figures.simulated_ms / 1000:,.0f} s"),
        ("wall time", f"{figures.wall_s:,.0f} s on {figures.workers} workers"),
        ("fault kinds on", ", ".join(figures.fault_kinds) or "none"),
        ("planted defect", figures.defect or "none"),
        (
            "client operations",
            f"{clients.get('ok', 0):,} ok, {clients.get('refused', 0):,}"
            f" refused, {clients.get('unknown_then_resolved', 0):,} outcome"
            " unknown then resolved by a retry under the same id"
            f" ({clients.get('answered_as_duplicate', 0):,} answered as the"
            " original)",
        ),
        (
            "acknowledged",
            f"{clients.get('acknowledged_orders', 0):,} orders,"
            f" {clients.get('acknowledged_transfers', 0):,} transfers",
        ),
        (
            "PostgreSQL transactions",
            f"{mesh.get('store_committed', 0):,} committed,"
            f" {mesh.get('store_aborted', 0):,} aborted,"
            f" {mesh.get('store_unknown', 0):,} of unknown outcome"
            f" ({mesh.get('store_unknown_committed', 0):,} had"
            " committed; every one resolved by reading the cursor"
            " back)",
        ),
        (
            "faults injected",
            ", ".join(f"{k} {v:,}" for k, v in sorted(figures.faults.items())) or "none",
        ),
        (
            "failovers",
            f"{mesh.get('leader_elections', 0):,} leader elections,"
            f" {mesh.get('fenced_leader_restarts', 0):,} fenced leaders restarted,"
            f" {mesh.get('etcd_fenced_appends', 0):,} fenced appends,"
            f" {mesh.get('snapshot_installs', 0):,} snapshots installed from a peer,"
            f" {mesh.get('version_switches_logged', 0):,} state-machine version switches"
            " logged (a group's first leader switches it to the newest version)",
        ),
        (
            "reconciler",
            f"{mesh.get('reconcile_suspects', 0):,} users suspected,"
            f" {mesh.get('reconcile_drift_confirmed', 0):,} drifts confirmed and reported"
            f" ({mesh.get('reconcile_reports', 0):,} reports); the shards judged"
            f" {mesh.get('reconciles_judged', 0):,} and healed"
            f" {mesh.get('reconcile_heals', 0):,}",
        ),
        (
            "etcd outages",
            f"{mesh.get('etcd_refusals', 0):,} calls refused without a quorum;"
            f" {mesh.get('leaders_ended_etcd_unavailable', 0):,} leaders ended past their"
            f" append deadline, {mesh.get('starts_failed_etcd_unavailable', 0):,} starts"
            f" failed and retried; {mesh.get('etcd_unanswered_commits', 0):,} appends"
            f" committed unanswered ({mesh.get('etcd_own_appends_found', 0):,} found by"
            " their own retry, the rest by the next leader's read)",
        ),
        (
            "etcd watches",
            f"{mesh.get('etcd_watches_created', 0):,} opened by followers, each after a"
            f" range read to the log's end; {mesh.get('etcd_watches_fell_behind', 0):,} fell"
            f" behind a paused follower, {mesh.get('etcd_watches_compacted', 0):,} ended by"
            f" a compaction ({mesh.get('etcd_compactions', 0):,} compactions, leaders' and"
            f" others'), {mesh.get('follower_rereads_WatchBroken', 0):,} broken; each"
            " followed by a range read",
        ),
        (
            "gateway",
            f"{clients.get('malformed_refused', 0):,} malformed requests refused with their"
            f" reason ({_refusals(mesh)}); {mesh.get('gateway_not_owner', 0):,} NOT_OWNER"
            f" answers ({mesh.get('gateway_shard_epoch_behind', 0):,} from a shard behind"
            f" the gateway's epoch, asked again); {mesh.get('gateway_in_transit_waits', 0):,}"
            f" waits for a user in transit, {mesh.get('gateway_routing_reads', 0):,} routing"
            f" reads past the watch's grace, {mesh.get('gateway_unavailable_in_transit', 0):,}"
            " clients told UNAVAILABLE",
        ),
        (
            "operator",
            f"{mesh.get('operator_commands', 0):,} commands sent (halts, risk limits,"
            f" restarts, and their lifts), {mesh.get('operator_accepted', 0):,} accepted"
            f" answers, {mesh.get('operator_refused', 0):,} refused"
            f" ({mesh.get('operator_stale', 0):,} stale, read again and sent anew);"
            f" {mesh.get('operator_copies_answered', 0):,} late copies answered as decided;"
            f" {mesh.get('operator_audit_rows', 0):,} admin_audit rows, each checked",
        ),
        (
            "replays for egress",
            f"{mesh.get('replays_for_egress', 0):,} restarts replayed again from an older"
            " snapshot for the persister's cursor",
        ),
        (
            "routing",
            f"{mesh.get('users_moved', 0):,} users moved between shard groups,"
            f" {mesh.get('user_moves_returned', 0):,} moves returned (not flat in time)",
        ),
        (
            "scaling",
            f"{mesh.get('scale_outs', 0):,} groups added and {mesh.get('scale_ins', 0):,}"
            f" removed while users traded ({mesh.get('scale_waves', 0):,} waves);"
            f" {mesh.get('scale_ins_blocked', 0):,} removals undone (users not flat),"
            f" {mesh.get('scale_users_held', 0):,} users held on their old group at a"
            f" cut-over; {mesh.get('wave_operations_killed', 0):,} operations cut short by"
            f" a controller kill, {mesh.get('wave_resumes', 0):,} controllers resumed;"
            f" {mesh.get('wave_stalls', 0):,} stalls, {mesh.get('wave_refusals', 0):,}"
            " refusals",
        ),
        (
            "market feed",
            f"{mesh.get('market_book_updates_checked', 0):,} book updates and"
            f" {mesh.get('market_trades_checked', 0):,} public trades checked on every"
            " matcher replica that applied them (sequences, trades against taker fills);"
            f" {mesh.get('market_books_compared', 0):,} books kept from the feed compared"
            " with the engine's",
        ),
        (
            "cancel-all",
            f"{clients.get('cancel_alls_accepted', 0):,} accepted answers to clients"
            f" ({clients.get('cancel_alls_listing_orders', 0):,} listing orders);"
            f" {mesh.get('cancel_alls_checked', 0):,} answers checked against the user's"
            f" live orders at their log position ({mesh.get('cancel_all_orders_listed', 0):,}"
            f" orders listed, {mesh.get('cancel_all_already_cancelling', 0):,} already"
            f" being cancelled); {mesh.get('cancelled_order_ends_checked', 0):,} ends of"
            " orders being cancelled checked"
            f" ({mesh.get('cancelled_orders_rejected_first', 0):,} refused by the matcher"
            f" before resting), {mesh.get('cancelled_orders_checked', 0):,} in the database"
            " after settling",
        ),
        (
            "invariant checks",
            f"{mesh.get('conservation_checks', 0):,} cross-shard money"
            f" balances, {mesh.get('state_hashes_compared', 0):,} state"
            f" hashes compared, {figures.audit_checks:,} audit checks",
        ),
        ("violations", violations),
        ("clients' longest wait", f"{figures.longest_client_wait_ms:,} ms"),
    ]
    for key, durations in sorted(figures.leaderless_ms.items()):
        rows.append((f"{key}: a group without a serving leader (ms)", _spread(durations)))
    out = ["| figure | value |", "| --- | --- |"]
    out.extend(f"| {name} | {value} |" for name, value in rows)
    return "\n".join(out)


def _refusals(mesh: dict[str, int]) -> str:
    prefix = "gateway_refused_"
    found = sorted((k.removeprefix(prefix), v) for k, v in mesh.items() if k.startswith(prefix))
    return ", ".join(f"{reason} {count:,}" for reason, count in found) or "none"
