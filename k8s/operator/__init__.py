"""The OmsCluster operator (kopf): the resource's spec says how many user-shard
clusters and which whale pins; the operator gets the routing document there through
the same fenced waves `omsctl` runs (`services/routing/wave_controller.py`)."""
