-- The helpers every script of this crate uses, put before each script's own text (`script.rs`
-- and `calendar.rs` join them): the server runs each script alone, so each carries them.

-- The server's clock in whole microseconds since the Unix epoch (about 2^51 today: exact in a
-- double).
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Milliseconds until `units` (of 1/d us) have passed, rounded up and at least 1: a key's expiry,
-- when its limit is full again or its period over.
local function expiry(units, d)
  local ms = d * 1000
  return math.max(1, math.floor((units + ms - 1) / ms))
end

