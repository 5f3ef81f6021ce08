"""User routing: which user shard (cluster) owns a user, under which epoch."""
