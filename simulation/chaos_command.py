"""`oms chaos report FILE`: a campaign's figures (`oms sim --seeds N --report FILE`) as a table."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulation import campaign
from simulation.report_text import campaign_markdown


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("chaos", help="the simulation campaign's figures")
    actions = parser.add_subparsers(dest="action", required=True)
    report = actions.add_parser("report", help="print a campaign's figures as a Markdown table")
    report.add_argument("file", type=Path, help="written by oms sim --seeds N --report FILE")
    parser.set_defaults(handler=main)


def main(arguments: argparse.Namespace) -> int:
    print(campaign_markdown(campaign.load(arguments.file)))
    return 0
