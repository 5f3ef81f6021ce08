"""The persister service."""
