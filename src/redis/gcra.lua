-- GCRA for one subject under one or more limits, decided atomically on the server's clock.
--
-- KEYS[i]  the subject's key for limit i (all in one hash slot: the caller puts the subject in a
--          {hash tag}).
-- ARGV     mode (0: all n or nothing; 1: grant up to n), n, then for each limit: token, burst,
--          denom. Time is counted in units of 1/denom us; one token is `token` units.
--
-- Lua numbers are doubles, so every quantity is kept an exact integer below 2^53: the clock is
-- whole microseconds since the Unix epoch (about 2^51 today); the TAT is stored as two doubles,
-- whole microseconds and a remainder in units, packed with the units' denom in 24 bytes (16 bytes,
-- without the denom, as earlier versions wrote: the denom is then this call's); and every
-- difference (debt, cost, window) is in units, below 2^52 because the caller keeps each window
-- below 2^51 units. A TAT written under another quota (another denom) keeps its instant: its
-- remainder is rescaled to this call's units, rounded up, so a quota changed at run time carries
-- the debt over as time.
-- Integer division of such numbers is exact: floor(a / b) for a, b < 2^53 is never off by one.
--
-- Reply: { allowed (1 or 0; 2 when n exceeds a limit's burst), granted, remaining, retry_us
-- (rounded up), reset_us (rounded up), index of the limit that binds (or whose burst n exceeds) }.

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local now = server_now()
local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local count = #KEYS
-- Each limit's figures, six to a limit: token, window, denom, debt, and where new debt starts.
local L = {}
local grant = n

for i = 1, count do
  local a = 3 * i
  local token, burst, d = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if mode == 0 and n > burst then
    return { 2, 0, 0, 0, 0, i }
  end
  local window = burst * token
  -- A TAT at or behind now is a full limit: new debt starts from now.
  local ahead, base_us, base_rem = 0, now, 0
  local stored = redis.call('GET', KEYS[i])
  if stored and (#stored == 16 or #stored == 24) then
    local us, rem, from = 0, 0, d
    if #stored == 24 then
      us, rem, from = struct.unpack('ddd', stored)
    else
      us, rem = struct.unpack('dd', stored)
    end
    if from ~= d and from > 0 then
      -- rem < from <= 128000 and d <= 128000: the product is exact.
      rem = math.floor((rem * d + from - 1) / from)
      if rem >= d then
        us, rem = us + 1, rem - d
      end
    end
    local du = us - now
    if du > 0 or (du == 0 and rem > 0) then
      -- Further ahead than any write leaves, unless the server's clock stepped back by weeks:
      -- refuse, with waits rounded up past the true ones.
      if du >= math.floor(4503599627370496 / d) then
        local cost_us = math.floor((math.min(n, burst) * token + d - 1) / d)
        return { 0, 0, 0, du + 1 + cost_us, du + 1, i }
      end
      ahead, base_us, base_rem = du * d + rem, us, rem
    end
  end
  local o = 6 * i
  L[o - 5], L[o - 4], L[o - 3], L[o - 2], L[o - 1], L[o] = token, window, d, ahead, base_us, base_rem
  if mode == 1 then
    local k = 0
    if window > ahead then k = math.floor((window - ahead) / token) end
    if k < grant then grant = k end
  end
end

-- Tokens asked of every limit: n, or in mode 1 what all of them can give (and when none can, the
-- one token whose wait the refusal reports).
local take = n
local allowed = 1
if mode == 1 then
  take = grant
  if grant == 0 and n > 0 then
    take, allowed = 1, 0
  end
elseif n > 0 then
  for i = 1, count do
    local o = 6 * i
    if L[o - 2] + take * L[o - 5] > L[o - 4] then allowed = 0 end
  end
end

local remaining, retry, reset, binding = -1, 0, 0, 1
for i = 1, count do
  local o = 6 * i
  local token, window, d, ahead = L[o - 5], L[o - 4], L[o - 3], L[o - 2]
  local after = ahead + take * token
  local left, full = 0, 0
  if allowed == 1 then
    if take > 0 then
      local rem = L[o] + take * token
      local carry = math.floor(rem / d)
      local ms = d * 1000
      redis.call('SET', KEYS[i], struct.pack('ddd', L[o - 1] + carry, rem - carry * d, d),
        'PX', math.floor((after + ms - 1) / ms))
    end
    if window > after then left = math.floor((window - after) / token) end
    full = math.floor((after + d - 1) / d)
  else
    if window > ahead then left = math.floor((window - ahead) / token) end
    full = math.floor((ahead + d - 1) / d)
    if after > window then
      local wait = math.floor((after - window + d - 1) / d)
      if wait > retry then retry = wait end
    end
  end
  if remaining < 0 or left < remaining then remaining, binding = left, i end
  if full > reset then reset = full end
end

if allowed == 0 then take = 0 end
return { allowed, take, remaining, retry, reset, binding }
