"""`oms sim`: the whole mesh in one process, one seed, simulated time (see `core/world.py`)."""
