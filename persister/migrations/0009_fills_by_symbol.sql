-- Candles and the market-data ticker read one symbol's trades by consensus time: one
-- taker fill per trade (the maker's fill of the same trade is left out).
CREATE INDEX fills_symbol_trades ON fills (symbol, consensus_time_ms, trade_id)
    INCLUDE (price_ticks, quantity_lots) WHERE NOT maker;
