"""The auditor's arithmetic: pure (no I/O, clock or randomness), fed rows, giving findings."""
