"""The market-data service: the matchers' feeds mirrored once and fanned out to clients."""
