-- The write-behind's usual transaction in one round trip: the writer fence checked,
-- the batch's new orders inserted, their changes applied, fills and ledger rows
-- inserted, the cursor moved, all in one statement (one implicit transaction).
-- Done as separate statements it was BEGIN, the fence, one statement per table,
-- the cursor and COMMIT: eight round trips, each a wake-up of the persister and of
-- a backend. The statements and their order are those of persister/order_rows.py,
-- trade_rows.py, cursor.py and writer_fence.py, which still write a batch holding
-- flushes or operator audit rows, and replay a refused batch row by row.
--
-- Returns what was written, so the caller tells replays from duplicates exactly as
-- before (by reading what is stored for the rows that were not inserted).
-- A token that is not the shard's current one raises SQLSTATE OMSWF and writes
-- nothing (persister/store.py maps it to WriterFencedError).
CREATE FUNCTION oms_write_rows(
    p_shard text, p_token bigint, p_cursor bigint,
    o_order_id text[], o_user_id bigint[], o_client_order_id text[], o_symbol text[],
    o_side smallint[], o_order_type smallint[], o_time_in_force smallint[],
    o_price_ticks bigint[], o_quantity_lots bigint[], o_quote_amount bigint[],
    o_status smallint[], o_filled_lots bigint[], o_remaining_lots bigint[],
    o_position bigint[], o_accepted_at_ms bigint[], o_updated_position bigint[],
    o_updated_at_ms bigint[], o_user_seq bigint[],
    c_order_id text[], c_status smallint[], c_filled_lots bigint[], c_remaining_lots bigint[],
    c_position bigint[], c_time_ms bigint[],
    f_order_id text[], f_trade_id bigint[], f_user_id bigint[], f_symbol text[],
    f_side smallint[], f_price_ticks bigint[], f_quantity_lots bigint[], f_fee bigint[],
    f_maker boolean[], f_position bigint[], f_consensus_time_ms bigint[],
    l_position bigint[], l_item_index integer[], l_user_id bigint[], l_account text[],
    l_asset text[], l_amount bigint[], l_reference text[], l_consensus_time_ms bigint[],
    OUT inserted_orders text[], OUT changed_orders integer,
    OUT inserted_fill_orders text[], OUT inserted_fill_trades bigint[],
    OUT inserted_ledger integer
) LANGUAGE plpgsql AS $$
DECLARE
    current_token bigint;
BEGIN
    SELECT token INTO current_token FROM writer_fences WHERE shard_id = p_shard FOR SHARE;
    IF current_token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'shard % is written by token % now, not %', p_shard, current_token,
            p_token USING ERRCODE = 'OMSWF';
    END IF;

    WITH inserted AS (
        INSERT INTO orders (order_id, user_id, client_order_id, symbol, side, order_type,
            time_in_force, price_ticks, quantity_lots, quote_amount, status, filled_lots,
            remaining_lots, shard_id, created_position, updated_position, accepted_at_ms,
            updated_at_ms, user_seq)
        SELECT o.order_id, o.user_id, o.client_order_id, o.symbol, o.side, o.order_type,
            o.time_in_force, o.price_ticks, o.quantity_lots, o.quote_amount, o.status,
            o.filled_lots, o.remaining_lots, p_shard, o.position, o.updated_position,
            o.accepted_at_ms, o.updated_at_ms, o.user_seq
        FROM unnest(o_order_id, o_user_id, o_client_order_id, o_symbol, o_side, o_order_type,
                    o_time_in_force, o_price_ticks, o_quantity_lots, o_quote_amount, o_status,
                    o_filled_lots, o_remaining_lots, o_position, o_accepted_at_ms,
                    o_updated_position, o_updated_at_ms, o_user_seq)
             AS o(order_id, user_id, client_order_id, symbol, side, order_type, time_in_force,
                  price_ticks, quantity_lots, quote_amount, status, filled_lots,
                  remaining_lots, position, accepted_at_ms, updated_position, updated_at_ms,
                  user_seq)
        ON CONFLICT DO NOTHING
        RETURNING order_id
    )
    SELECT coalesce(array_agg(order_id), '{}') INTO inserted_orders FROM inserted;

    WITH changed AS (
        UPDATE orders AS o
        SET status = c.status, filled_lots = c.filled_lots, remaining_lots = c.remaining_lots,
            updated_position = c.position, updated_at_ms = c.time_ms
        FROM unnest(c_order_id, c_status, c_filled_lots, c_remaining_lots, c_position,
                    c_time_ms)
             AS c(order_id, status, filled_lots, remaining_lots, position, time_ms)
        WHERE o.order_id = c.order_id AND o.updated_position < c.position
        RETURNING o.order_id
    )
    SELECT count(*) INTO changed_orders FROM changed;

    WITH inserted AS (
        INSERT INTO fills (order_id, trade_id, user_id, symbol, side, price_ticks,
            quantity_lots, fee, maker, shard_id, position, consensus_time_ms)
        SELECT f.order_id, f.trade_id, f.user_id, f.symbol, f.side, f.price_ticks,
            f.quantity_lots, f.fee, f.maker, p_shard, f.position, f.consensus_time_ms
        FROM unnest(f_order_id, f_trade_id, f_user_id, f_symbol, f_side, f_price_ticks,
                    f_quantity_lots, f_fee, f_maker, f_position, f_consensus_time_ms)
             AS f(order_id, trade_id, user_id, symbol, side, price_ticks, quantity_lots, fee,
                  maker, position, consensus_time_ms)
        ON CONFLICT DO NOTHING
        RETURNING order_id, trade_id
    )
    SELECT coalesce(array_agg(order_id), '{}'), coalesce(array_agg(trade_id), '{}')
    INTO inserted_fill_orders, inserted_fill_trades FROM inserted;

    WITH inserted AS (
        INSERT INTO ledger (shard_id, position, item_index, user_id, account, asset, amount,
            reference, consensus_time_ms)
        SELECT p_shard, l.* FROM unnest(l_position, l_item_index, l_user_id, l_account,
            l_asset, l_amount, l_reference, l_consensus_time_ms)
            AS l(position, item_index, user_id, account, asset, amount, reference,
                 consensus_time_ms)
        ON CONFLICT DO NOTHING
        RETURNING position
    )
    SELECT count(*) INTO inserted_ledger FROM inserted;

    INSERT INTO persister_cursor (shard_id, position) VALUES (p_shard, p_cursor)
    ON CONFLICT (shard_id) DO UPDATE SET
        position = greatest(persister_cursor.position, excluded.position), updated_at = now();
END;
$$;
