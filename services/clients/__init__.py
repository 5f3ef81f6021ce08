"""Clients of the mesh's own gRPC services, shared by every service that calls them."""
