-- An operator's commands to the shard (risk limits, trading halts, restarts) are logged
-- commands; the shard answers each with an OperatorAudit egress item, written here
-- behind the shard like the ledger: keyed by its place in the shard's egress (shard,
-- log position, index among the audit items of that position), so a replayed position
-- writes nothing twice. `at` is the command's consensus time. Rows written by the
-- persister's own API (API keys) have no log place.
ALTER TABLE admin_audit
    ADD COLUMN shard_id text,
    ADD COLUMN position bigint CHECK (position > 0),
    ADD COLUMN item_index integer CHECK (item_index >= 0),
    ADD COLUMN accepted boolean NOT NULL DEFAULT true,
    ADD COLUMN reject_reason text NOT NULL DEFAULT '',
    ADD COLUMN note text NOT NULL DEFAULT '',
    ADD CONSTRAINT admin_audit_log_place CHECK (
        (shard_id IS NULL) = (position IS NULL) AND (position IS NULL) = (item_index IS NULL)
    );
CREATE UNIQUE INDEX admin_audit_logged ON admin_audit (shard_id, position, item_index)
    WHERE shard_id IS NOT NULL;
