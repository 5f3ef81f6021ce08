"""The bridge service."""
