"""Transport security: the mesh's certificates and the TLS credentials of its gRPC links."""
