"""`python -m services.manual` rewrites the reference pages in docs/reference/ from the
code (`make reference`); `--check` changes nothing and exits 1 naming each page that
differs from what the code generates; `--uncommented` lists the proto elements
(RPCs, messages, fields, enums and values) that have no comment."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.manual import pages


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.manual", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="only compare; exit 1 if a page differs"
    )
    parser.add_argument(
        "--uncommented", action="store_true", help="list the proto elements with no comment"
    )
    arguments = parser.parse_args(argv)
    if arguments.uncommented:
        from services.manual import api_reference  # noqa: PLC0415  (protoc: only when asked)

        for element in api_reference.uncommented():
            print(f"{element.file}: {element.kind} {element.name}")
        return 0
    if arguments.check:
        stale = pages.differing()
        for page in stale:
            print(f"{page}: differs from what the code generates (run `make reference`)")
        return 1 if stale else 0
    for page in pages.write():
        print(f"{page}: rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
