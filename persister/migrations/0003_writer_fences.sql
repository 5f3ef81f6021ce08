-- One writer per shard, fenced in the database itself: the token of the persister
-- that writes for the shard now (its etcd term when leased, else a counter taken
-- under the shard's advisory lock). Every write transaction of a persister first
-- reads its shard's row FOR SHARE and stops if the token is not its own; a newer
-- persister's claim waits for those transactions, then raises the token, so an old
-- writer's next transaction is refused. A claim with an older token than the row's
-- is refused too.
CREATE TABLE writer_fences (
    shard_id text PRIMARY KEY,
    token bigint NOT NULL CHECK (token > 0)
);
