"""Settings of one `oms marketdata` process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.coordination.group_keys import DEFAULT_MESH_ID
from services.settings import setting


@dataclass(frozen=True)
class MarketDataSettings:
    listen: str = setting(
        env="OMS_MARKETDATA_LISTEN",
        default="127.0.0.1:7701",
        help="public gRPC listen address (TLS with the gateway's public certificate)",
    )
    matchers: str = setting(
        env="OMS_MATCHERS",
        default="g1=127.0.0.1:7101",
        help="group=host:port,... for every matcher group; group=etcd: its leader in etcd",
    )
    markets_file: Path | None = setting(
        env="OMS_MARKETS_FILE", default=None, help="market catalog (default: packaged)"
    )
    persister: str = setting(
        env="OMS_MARKETDATA_PERSISTER",
        default="127.0.0.1:7301",
        help="a persister (candles, the tickers' day before the start, and keys when not"
        " public): host:port, or etcd (the leader of OMS_MARKETDATA_PERSISTER_SHARD's)",
    )
    persister_shard: str = setting(
        env="OMS_MARKETDATA_PERSISTER_SHARD",
        default="s1",
        help="whose persister OMS_MARKETDATA_PERSISTER=etcd names",
    )
    public: bool = setting(
        env="OMS_MARKETDATA_PUBLIC",
        default=True,
        help="true: anyone may read market data; false: every call is signed by a key"
        " with the READ scope, as at the gateway",
    )
    timestamp_window_ms: int = setting(
        env="OMS_MARKETDATA_TIMESTAMP_WINDOW_MS",
        default=5_000,
        help="signed calls (when not public) older or newer than this are refused",
    )
    max_streams: int = setting(
        env="OMS_MARKETDATA_MAX_STREAMS",
        default=5_000,
        help="streams (books and trades) the service holds at once; past it RESOURCE_EXHAUSTED",
    )
    streams_per_peer: int = setting(
        env="OMS_MARKETDATA_STREAMS_PER_PEER",
        default=200,
        help="streams one connection may hold at once; past it RESOURCE_EXHAUSTED",
    )
    queue_messages: int = setting(
        env="OMS_MARKETDATA_QUEUE_MESSAGES",
        default=1_000,
        help="unsent messages a stream may hold: a book stream past it gets a fresh book"
        " instead, a trade stream ends RESOURCE_EXHAUSTED",
    )
    retained_trades: int = setting(
        env="OMS_MARKETDATA_RETAINED_TRADES",
        default=10_000,
        help="trades kept per symbol for StreamTrades' from_trade_sequence",
    )
    persister_timeout_ms: int = setting(
        env="OMS_MARKETDATA_PERSISTER_TIMEOUT_MS",
        default=5_000,
        help="deadline of each call to the persister, in ms",
    )
    backoff_initial_ms: int = setting(
        env="OMS_MARKETDATA_BACKOFF_INITIAL_MS",
        default=50,
        help="first wait before following a matcher group again after its stream broke",
    )
    backoff_max_ms: int = setting(
        env="OMS_MARKETDATA_BACKOFF_MAX_MS",
        default=1_000,
        help="longest wait between two attempts to follow a matcher group",
    )
    etcd_endpoints: tuple[str, ...] = setting(
        env="OMS_ETCD_ENDPOINTS",
        default=(),
        help="etcd's members, host:port,...: for addresses given as etcd",
    )
    mesh_id: str = setting(
        env="OMS_MESH_ID",
        default=DEFAULT_MESH_ID,
        help="this mesh's name in etcd, its keys' namespace (unique per etcd cluster)",
    )
    log_level: str = setting(
        env="OMS_LOG_LEVEL", default="INFO", help="DEBUG, INFO, WARNING or ERROR (JSON lines)"
    )
