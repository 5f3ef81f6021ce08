-- `oms_write_rows` touches rows by key only: the writer fence and the cursor by their
-- shard, orders by order id, and its inserts' conflict checks by their unique indexes.
-- PL/pgSQL keeps a generic plan per statement for the whole session once five runs
-- found it no worse; made while `orders` was young and small, the UPDATE's generic plan
-- was a sequential scan of `orders` hashed against the batch's arrays, and it was kept
-- as the table grew: every write transaction read every order (`oms bench e2e`, 1,000
-- orders/s: one scan of all of `orders` per transaction; PostgreSQL's CPU per batch of
-- 16 orders rose from 1.2 to 9 ms over the first 38,000 orders, measured alone).
--
-- With sequential scans priced out for this function its plans are index plans however
-- small the tables were when they were made (a table with no usable index would still be
-- scanned: the setting changes plan choices, never results), and they stay cached
-- (`plan_cache_mode = auto` here, while the persister's sessions plan every other
-- statement for its own arguments: persister/store.py).
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION %s SET enable_seqscan = off',
        'oms_write_rows'::regproc::regprocedure
    );
    EXECUTE format(
        'ALTER FUNCTION %s SET plan_cache_mode = auto',
        'oms_write_rows'::regproc::regprocedure
    );
END;
$$;
