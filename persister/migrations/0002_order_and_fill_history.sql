-- Order and fill histories (the gateway's ListOrders and ListFills): a user's rows in
-- the order they happened, read in keyset pages, and when each order last changed.

-- The user's order sequence (the last part of "<shard>:<user>:<user_seq>"): it orders
-- one user's orders as they were accepted, also among orders of one log entry, which
-- share a consensus time; the order id's text does not ("s1:7:10" < "s1:7:9").
ALTER TABLE orders ADD COLUMN user_seq bigint NOT NULL DEFAULT 0 CHECK (user_seq >= 0);
UPDATE orders SET user_seq = split_part(order_id, ':', 3)::bigint
    WHERE split_part(order_id, ':', 3) ~ '^[0-9]{1,18}$';

-- Consensus time of the last update written (the insert's own time until one comes).
ALTER TABLE orders ADD COLUMN updated_at_ms bigint NOT NULL DEFAULT 0
    CHECK (updated_at_ms >= 0);
UPDATE orders SET updated_at_ms = accepted_at_ms;

CREATE INDEX orders_user_history ON orders (user_id, accepted_at_ms, user_seq);

-- Replaces fills_user: the same leading column, in page order.
CREATE INDEX fills_user_history ON fills (user_id, consensus_time_ms, order_id, trade_id);
DROP INDEX fills_user;
