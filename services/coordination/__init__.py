"""Coordination through etcd: the adapter (`etcd_session`) and what the mesh builds on it."""
