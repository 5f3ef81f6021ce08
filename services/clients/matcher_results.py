"""What a matcher's Execute stream answers: every command's result, or the exceptions.

The bridge reads Execute's results only to count two exceptions (an order id the
matcher already knew, a cancel of an unknown id): the truth of every order comes
back on the sequenced event stream. A result per command was a message back per
message out, one wake-up each side, for nothing; a caller that sends
`RESULTS_METADATA_KEY: EXCEPTIONS_ONLY` in its call's metadata gets a result batch
only when one of its commands was a duplicate or not found. Flow control stays
explicit: the matcher reads at most its in-flight window of batches ahead of its
log, and gRPC's flow control holds the writer back past that.
"""

from __future__ import annotations

from collections.abc import Iterable

RESULTS_METADATA_KEY = "oms-matcher-results"
EXCEPTIONS_ONLY = "exceptions"
EXCEPTIONS_ONLY_METADATA = ((RESULTS_METADATA_KEY, EXCEPTIONS_ONLY),)


def wants_exceptions_only(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    return any(
        key == RESULTS_METADATA_KEY and value == EXCEPTIONS_ONLY for key, value in metadata or ()
    )
