"""The shared runtime and the shard, matcher and reconciler services of the OMS mesh."""
