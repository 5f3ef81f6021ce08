"""The market catalog: which symbols trade, their units and fees, and their matcher group."""
