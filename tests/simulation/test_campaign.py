"""`oms sim --seeds N --report F` and `oms chaos report F`: a campaign's figures, saved
and read back, as the README's table."""

from __future__ import annotations

from pathlib import Path

from simulation.campaign import load, run_campaign, save
from simulation.core.faults import FaultPlan
from simulation.report_text import campaign_markdown


def test_a_campaign_saved_and_read_back_gives_the_table(tmp_path: Path) -> None:
    figures, failures = run_campaign(3, 2, 8_000, FaultPlan(), workers=2)
    assert not failures and figures.seeds == figures.passed == 2
    save(figures, tmp_path / "chaos.json")
    again = load(tmp_path / "chaos.json")
    table = campaign_markdown(again)
    assert table == campaign_markdown(figures)
    rows = {line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]}
    for row in (
        "seeds",
        "faults injected",
        "etcd watches",
        "gateway",
        "market feed",
        "cancel-all",
        "violations",
    ):
        assert row in rows, table
    assert "| seeds | 3..4 (2): 2 passed, 0 failed |" in table
    assert "| violations | none |" in table
