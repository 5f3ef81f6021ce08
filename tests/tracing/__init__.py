"""Traces across the mesh, received by a real OTLP receiver."""
