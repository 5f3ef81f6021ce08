"""An audit's report as an operator reads it, and as JSON."""

from __future__ import annotations

from typing import Any

from auditor.core.findings import CHECKS, AuditReport


def report_document(report: AuditReport) -> dict[str, Any]:
    return {
        "clean": report.clean,
        "figures": report.figures,
        "checks_evaluated": report.evaluated,
        "violations": report.counts,
        "examples": [
            {"check": f.check, "subject": f.subject, "detail": f.detail} for f in report.examples
        ],
    }


def render_report(report: AuditReport) -> str:
    figures = report.figures
    lines = [
        "oms audit: "
        + ("clean" if report.clean else f"{report.violations} violations")
        + f" after {figures.get('audits', 1)} audit(s), {report.evaluated} checks evaluated",
        "  read: "
        + ", ".join(
            f"{figures.get(name, 0)} {name.replace('_', ' ')}"
            for name in (
                "users",
                "deposits",
                "withdrawals",
                "orders",
                "fills",
                "trades",
                "postings",
                "ledger_rows",
            )
        ),
        "  compared: "
        f"{figures.get('answered_users_compared', 0)} users as the admin API answers,"
        f" {figures.get('stored_users_compared', 0)} stored users,"
        f" {figures.get('acknowledged_orders', 0)} acknowledged orders",
    ]
    for check, count in sorted(report.counts.items()):
        lines.append(f"  {check} ({count}): {CHECKS[check]}")
        lines.extend(f"    {f.subject}: {f.detail}" for f in report.examples if f.check == check)
    return "\n".join(lines)
