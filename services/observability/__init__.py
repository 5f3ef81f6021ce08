"""Logs, traces and metrics shared by every service (configured once at start)."""
