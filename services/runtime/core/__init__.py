"""Pure part of the runtime: no I/O, no clock, no randomness (checked by a test)."""
