-- The system of record of the OMS mesh. Written only by persisters (one per shard).
-- Money columns are bigint minor units; CHECKs hold what the shard guarantees, so a
-- row that breaks an invariant is refused (and counted) instead of stored.

-- Users: the quiescent state of the last completed flush (oms.v1.UserState bytes).
-- `version` is the CAS counter: a flush writes only where version = its db_version.
CREATE TABLE users (
    user_id bigint PRIMARY KEY CHECK (user_id > 0),
    version bigint NOT NULL DEFAULT 0 CHECK (version >= 0),
    tier smallint NOT NULL CHECK (tier BETWEEN 0 AND 2),
    state bytea NOT NULL,
    flush_epoch bigint NOT NULL DEFAULT 0 CHECK (flush_epoch >= 0),
    flush_position bigint NOT NULL DEFAULT 0 CHECK (flush_position >= 0),
    flushed_by text,                      -- shard id of the last flush
    flushed_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- Flush answers committed recently are sent again after a reconnect.
CREATE INDEX users_recent_flushes ON users (flushed_by, flushed_at);

-- Ids the persister hands out when CreateUser asks for user_id 0.
CREATE SEQUENCE user_ids AS bigint START WITH 1;

-- Balances as of the last flush, one row per asset: readable SQL next to the state bytes.
CREATE TABLE balances (
    user_id bigint NOT NULL REFERENCES users (user_id),
    asset text NOT NULL CHECK (asset <> ''),
    total bigint NOT NULL CHECK (total >= 0),
    PRIMARY KEY (user_id, asset)
);

-- API keys; the secret is the HMAC key and must be readable for verification.
CREATE TABLE api_keys (
    api_key text PRIMARY KEY CHECK (api_key <> ''),
    user_id bigint NOT NULL REFERENCES users (user_id),
    secret text NOT NULL CHECK (secret <> ''),
    enabled boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_keys_user ON api_keys (user_id);

-- Orders, written behind the shard: inserted when admitted (SubmitToME), updated by
-- later order updates only when their log position is newer. No foreign keys on the
-- write-behind tables: the shard already decided these facts; refusing one would
-- lose history, so only invariants of the row itself are checked.
CREATE TABLE orders (
    order_id text PRIMARY KEY CHECK (order_id <> ''),
    user_id bigint NOT NULL CHECK (user_id > 0),
    client_order_id text NOT NULL CHECK (client_order_id <> ''),
    symbol text NOT NULL CHECK (symbol <> ''),
    side smallint NOT NULL CHECK (side IN (1, 2)),
    order_type smallint NOT NULL CHECK (order_type IN (1, 2)),
    time_in_force smallint NOT NULL CHECK (time_in_force BETWEEN 0 AND 5),
    price_ticks bigint NOT NULL CHECK (price_ticks >= 0),
    quantity_lots bigint NOT NULL CHECK (quantity_lots >= 0),
    quote_amount bigint NOT NULL CHECK (quote_amount >= 0),
    status smallint NOT NULL CHECK (status BETWEEN 1 AND 7),
    filled_lots bigint NOT NULL CHECK (filled_lots >= 0),
    remaining_lots bigint NOT NULL CHECK (remaining_lots >= 0),
    shard_id text NOT NULL,
    created_position bigint NOT NULL CHECK (created_position > 0),
    updated_position bigint NOT NULL CHECK (updated_position >= created_position),
    accepted_at_ms bigint NOT NULL CHECK (accepted_at_ms >= 0),
    UNIQUE (user_id, client_order_id)
);

CREATE TABLE fills (
    order_id text NOT NULL,
    trade_id bigint NOT NULL CHECK (trade_id > 0),
    user_id bigint NOT NULL CHECK (user_id > 0),
    symbol text NOT NULL,
    side smallint NOT NULL CHECK (side IN (1, 2)),
    price_ticks bigint NOT NULL CHECK (price_ticks > 0),
    quantity_lots bigint NOT NULL CHECK (quantity_lots > 0),
    fee bigint NOT NULL CHECK (fee >= 0),
    maker boolean NOT NULL,
    shard_id text NOT NULL,
    position bigint NOT NULL CHECK (position > 0),
    consensus_time_ms bigint NOT NULL,
    UNIQUE (order_id, trade_id)
);
CREATE INDEX fills_user ON fills (user_id);

-- Double-entry ledger: one row per LedgerEntry egress item; `item_index` numbers the
-- ledger items of one shard log position. Append-only (the trigger below).
CREATE TABLE ledger (
    shard_id text NOT NULL,
    position bigint NOT NULL CHECK (position > 0),
    item_index integer NOT NULL CHECK (item_index >= 0),
    user_id bigint NOT NULL CHECK (user_id >= 0),
    account text NOT NULL CHECK (account IN ('user', 'clearing', 'fees', 'external')),
    asset text NOT NULL CHECK (asset <> ''),
    amount bigint NOT NULL,
    reference text NOT NULL,
    consensus_time_ms bigint NOT NULL,
    PRIMARY KEY (shard_id, position, item_index),
    CHECK ((account = 'user') = (user_id > 0))
);
CREATE INDEX ledger_user ON ledger (user_id) WHERE user_id > 0;

CREATE FUNCTION ledger_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger rows are never updated or deleted';
END;
$$;
CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION ledger_is_append_only();

-- Where each shard's persister resumes: written in the same transaction as its rows.
CREATE TABLE persister_cursor (
    shard_id text PRIMARY KEY,
    position bigint NOT NULL CHECK (position >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Reserved for shard snapshot bytes (DESIGN.md section 3: snapshot bytes in PostgreSQL
-- or files). Unused so far: the shard keeps its snapshots in files.
CREATE TABLE shard_snapshots (
    shard_id text NOT NULL,
    position bigint NOT NULL CHECK (position > 0),
    bytes bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard_id, position)
);
