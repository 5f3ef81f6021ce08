"""Serving the mesh's stateless services (gateway, persister, bridge, reconciler)."""
