-- Candles and the market-data ticker read one symbol's trades by consensus time: one
-- taker fill per trade (the maker's fill of the same trade is left out). The second index
-- answers, for a symbol, the largest trade id stored and how many trades are stored up to
-- an id without reading the table (the ticker waits for them at the service's start).
CREATE INDEX fills_symbol_trades ON fills (symbol, consensus_time_ms, trade_id)
    INCLUDE (price_ticks, quantity_lots) WHERE NOT maker;
CREATE INDEX fills_symbol_trade_ids ON fills (symbol, trade_id) WHERE NOT maker;
