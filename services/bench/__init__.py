"""Benchmarks (`oms bench …`): figures are measured here, never asserted by timed tests."""
