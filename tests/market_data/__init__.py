"""The market-data service: its pure parts (the mirrored book, its depth views and their
diffs, the fan-out, the bounded stream queues, the rolling 24 hours) and the service as
real processes."""
