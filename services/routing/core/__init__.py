"""The pure part of routing: the stable hash, rendezvous ownership and the routing
document. No I/O, clock or randomness: the shard's state machine decides ownership
with it at a log position, and every gateway computes the same answer."""
