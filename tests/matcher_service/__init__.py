"""The matcher as a service: real `oms matcher` processes on loopback, driven over gRPC."""
