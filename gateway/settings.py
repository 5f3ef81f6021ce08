"""Settings of one `oms gateway` process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.coordination.group_keys import DEFAULT_MESH_ID
from services.settings import setting


@dataclass(frozen=True)
class GatewaySettings:
    listen: str = setting(
        env="OMS_GATEWAY_LISTEN",
        default="127.0.0.1:7000",
        help="host:port the public order API and the admin API listen on (gRPC)",
    )
    routing: str = setting(
        env="OMS_GATEWAY_ROUTING",
        default="static",
        help="static: every user on the one shard of OMS_SHARD_ID / OMS_SHARD_ADDRESS; "
        "etcd: by the mesh's routing document in etcd, over every cluster it names",
    )
    shard_address: str = setting(
        env="OMS_SHARD_ADDRESS",
        default="127.0.0.1:7201",
        help="the one shard (static routing): host:port, or etcd (its leader, replicated)",
    )
    shard_id: str = setting(
        env="OMS_SHARD_ID", default="s1", help="the one shard's cluster id (static routing)"
    )
    shards: str = setting(
        env="OMS_SHARDS",
        default="",
        help="etcd routing: id=host:port or id=etcd for each shard cluster; a cluster not "
        "listed is found by its leader's key in etcd",
    )
    persisters: str = setting(
        env="OMS_PERSISTERS",
        default="",
        help="etcd routing: id=host:port or id=etcd for each cluster's persister (same rule)",
    )
    reroute_ms: int = setting(
        env="OMS_GATEWAY_REROUTE_MS",
        default=2_000,
        help="how long a command may wait for a newer routing epoch (NOT_OWNER, a user in "
        "transit) before its client is told to retry",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,...: needed by etcd routing and by any address"
        " given as etcd (a shard, persister or matcher found by its leader's key)",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    persister_address: str = setting(
        env="OMS_PERSISTER_ADDRESS",
        default="127.0.0.1:7301",
        help="the one shard's persister (static routing): host:port, or etcd (its leader)",
    )
    matchers: str = setting(
        env="OMS_MATCHERS", default="", help="group=host:port,... for every matcher group"
    )
    markets_file: Path | None = setting(
        env="OMS_MARKETS_FILE", default=None, help="market catalog (default: packaged)"
    )
    admin_api_key: str = setting(
        env="OMS_ADMIN_API_KEY", default="", help="empty: the admin API refuses every call"
    )
    admin_api_secret: str = setting(
        env="OMS_ADMIN_API_SECRET",
        default="",
        help="the admin key's HMAC secret (required when OMS_ADMIN_API_KEY is set)",
    )
    timestamp_window_ms: int = setting(
        env="OMS_GATEWAY_TIMESTAMP_WINDOW_MS",
        default=5_000,
        help="signed requests older or newer than this are refused",
    )
    credential_cache_size: int = setting(
        env="OMS_GATEWAY_CREDENTIAL_CACHE",
        default=100_000,
        help="API keys kept in memory, at most (the least recently used go first)",
    )
    credential_ttl_ms: int = setting(
        env="OMS_GATEWAY_CREDENTIAL_TTL_MS",
        default=60_000,
        help="a known key is checked with the persister again this often, in the background"
        " (a disabled or rotated key is refused within this plus one persister answer)",
    )
    credential_stale_limit_ms: int = setting(
        env="OMS_GATEWAY_CREDENTIAL_STALE_LIMIT_MS",
        default=3_600_000,
        help="while the persister or PostgreSQL cannot answer, known keys keep working for"
        " this long past the last answer that vouched for them",
    )
    credential_retry_ms: int = setting(
        env="OMS_GATEWAY_CREDENTIAL_RETRY_MS",
        default=1_000,
        help="a background key check that failed is tried again after this long",
    )
    unknown_key_ttl_ms: int = setting(
        env="OMS_GATEWAY_UNKNOWN_KEY_TTL_MS",
        default=1_000,
        help="how long an unknown key is remembered as unknown (kept short: a new key works soon)",
    )
    request_deadline_ms: int = setting(
        env="OMS_GATEWAY_REQUEST_DEADLINE_MS",
        default=5_000,
        help="every unary call and every Trade request is answered within this long"
        " (TIMEOUT if nothing else came first: retry with the same ids)",
    )
    shard_unanswered_batches: int = setting(
        env="OMS_GATEWAY_SHARD_UNANSWERED_BATCHES",
        default=1,
        help="batches of orders sent to a shard and not yet answered, at most (0: no"
        " bound); the orders that arrive meanwhile leave together in the next batch, so"
        " unary calls share messages and log entries as the load rises",
    )
    persister_timeout_ms: int = setting(
        env="OMS_GATEWAY_PERSISTER_TIMEOUT_MS",
        default=5_000,
        help="deadline of each call to a persister (keys, users, history, prefetch), in ms",
    )
    matcher_timeout_ms: int = setting(
        env="OMS_GATEWAY_MATCHER_TIMEOUT_MS",
        default=5_000,
        help="deadline of an admin command to a matcher group (halt, resume, kill switch), in ms",
    )
    prefetch_interval_ms: int = setting(
        env="OMS_GATEWAY_PREFETCH_INTERVAL_MS",
        default=60_000,
        help="hydrate-ahead asks the persister at most once per user per interval",
    )
    order_update_queue: int = setting(
        env="OMS_GATEWAY_ORDER_UPDATE_QUEUE",
        default=10_000,
        help="updates buffered per subscriber; past this the subscriber is disconnected",
    )
    trade_in_flight: int = setting(
        env="OMS_GATEWAY_TRADE_IN_FLIGHT",
        default=10_000,
        help="requests in flight per Trade stream before reading pauses",
    )
    reflection: bool = setting(
        env="OMS_GATEWAY_REFLECTION",
        default=True,
        help="serve gRPC server reflection (grpcurl and other tools list and call the API);"
        " it reveals only the public protos, and every call still needs its signature",
    )
    log_level: str = setting(
        env="OMS_LOG_LEVEL", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines)"
    )


@dataclass(frozen=True)
class ClientSettings:
    """`oms client`: where the gateway is and whose key signs the calls."""

    gateway_address: str = setting(
        env="OMS_GATEWAY_ADDRESS", default="127.0.0.1:7000", help="host:port of the gateway"
    )
    market_data_address: str = setting(
        env="OMS_MARKETDATA_ADDRESS",
        default="",
        help="host:port of the market-data service (the market-data commands); empty: the"
        " local mesh's, from its state folder",
    )
    user_id: int = setting(env="OMS_USER_ID", default=0, help="the account the key belongs to")
    api_key: str = setting(
        env="OMS_API_KEY", default="", help="the API key id that signs each call"
    )
    api_secret: str = setting(env="OMS_API_SECRET", default="", help="that key's HMAC secret")
