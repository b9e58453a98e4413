-- GCRA for one subject under one or more limits, decided atomically on the server's clock.
--
-- KEYS[i]  the subject's key for limit i (all in one hash slot: the caller puts the subject in a
--          {hash tag}).
-- ARGV     mode (0: all n or nothing; 1: grant up to n; 2: all or nothing, each limit's figures
--          told; 3: all or nothing, each limit's TAT after an admission told, for a charge's
--          settlement), n, then for each limit: token, burst,
--          denom, carry. Time is counted in units of 1/denom us; one token is `token` units.
--          carry says what a state written under another quota becomes (0: the debt as time;
--          1: the same share of the window).
--
-- Lua numbers are doubles, so every quantity is kept an exact integer below 2^53: the clock is
-- whole microseconds since the Unix epoch (about 2^51 today); the TAT is stored as doubles, whole
-- microseconds and a remainder in units, packed with the quota it was written under (denom,
-- token, burst) in 40 bytes (24 bytes with the denom alone, and 16 without it, as earlier versions
-- wrote: the quota is then unknown, and the debt carries as time); and every difference (debt,
-- cost, window) is in units, below 2^52 because the caller keeps each window below 2^51 units.
-- Integer division of such numbers is exact: floor(a / b) for a, b < 2^53 is never off by one.
--
-- A TAT written under another quota is carried over when the subject is next seen (no pass over
-- every subject could keep up with live calls): as time, its remainder rescaled to this call's
-- units, rounded up; or as the share of the old window in use then, rounded up in this call's
-- units, a debt past the whole old window counting as an empty limit. Either is carried once:
-- the carried state is written, a refusal or a peek included, so that a subject rounds once per
-- quota it is seen under, as a local limiter rounds once per change.
--
-- In mode 2, two more arguments per limit may follow all of those: the tokens that limit is asked
-- (in place of n) and whether it is in shadow mode (1: it decides only for itself: it takes its
-- tokens when the request passes and it has room, and never refuses the request).
--
-- Reply: { allowed (1 or 0; 2 when n exceeds a limit's burst), granted, remaining, retry_us
-- (rounded up), reset_us (rounded up), index of the limit that binds (or whose burst n exceeds) };
-- in mode 2 followed, for a decision, by four figures of each limit in order: whether it alone had
-- room (1 or 0), remaining, retry_us and reset_us, as that limit stands after the decision; in
-- mode 3 followed, for an admission of n > 0, by the TAT each limit's write left, whole
-- microseconds and remainder, two to a limit.

-- ceil(a * b / c) for integers a < c and b, c below 2^52, where the product would lose bits as a
-- double: a binary long division of the product (held as four 26-bit digits) whose running
-- remainder stays below 2 * c < 2^53.
local function muldiv_ceil(a, b, c)
  local h = 67108864 -- 2^26
  local a1, a0 = math.floor(a / h), a % h
  local b1, b0 = math.floor(b / h), b % h
  -- The product in base 2^26, low digit first; each digit below 2^53 before its carry.
  local d0 = a0 * b0
  local d1 = a1 * b0 + math.floor(d0 / h)
  d0 = d0 % h
  local d2 = math.floor(d1 / h)
  d1 = d1 % h
  d1 = d1 + a0 * b1
  d2 = d2 + math.floor(d1 / h)
  d1 = d1 % h
  d2 = d2 + a1 * b1
  local d3 = math.floor(d2 / h)
  d2 = d2 % h
  local q, r = 0, 0
  for _, digit in ipairs({ d3, d2, d1, d0 }) do
    for bit = 25, 0, -1 do
      local p = 2 ^ bit
      r = r * 2 + math.floor(digit / p) % 2
      q = q * 2
      if r >= c then
        r, q = r - c, q + 1
      end
    end
  end
  if r > 0 then q = q + 1 end
  return q
end

local now = server_now()
local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local count = #KEYS
-- Each limit's figures, seven to a limit: token, window, denom, debt, where new debt starts (whole
-- microseconds and remainder), and the burst.
local L = {}
local grant = n

-- Limits whose state was carried over (as a share, or as time into other units), to be written
-- whatever the decision.
local carried = {}

-- Each limit's tokens and shadow flag (mode 2's trailing arguments; else n, and not in shadow).
local N, S = {}, {}
local own = mode == 2 and #ARGV >= 2 + 6 * count

for i = 1, count do
  local a = 4 * i - 1
  local token, burst, d = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local share = tonumber(ARGV[a + 3]) == 1
  local ni, si = n, false
  if own then
    ni = tonumber(ARGV[2 + 4 * count + 2 * i - 1])
    si = tonumber(ARGV[2 + 4 * count + 2 * i]) == 1
  end
  N[i], S[i] = ni, si
  if mode ~= 1 and ni > burst and not si then
    return { 2, 0, 0, 0, 0, i }
  end
  local window = burst * token
  -- A TAT at or behind now is a full limit: new debt starts from now.
  local ahead, base_us, base_rem = 0, now, 0
  local stored = redis.call('GET', KEYS[i])
  if stored and (#stored == 16 or #stored == 24 or #stored == 40) then
    local us, rem, from, old_token, old_burst = 0, 0, d, token, burst
    local rescaled = false
    if #stored == 40 then
      us, rem, from, old_token, old_burst = struct.unpack('ddddd', stored)
    elseif #stored == 24 then
      us, rem, from = struct.unpack('ddd', stored)
    else
      us, rem = struct.unpack('dd', stored)
    end
    local other = from ~= d or old_token ~= token or old_burst ~= burst
    if share and other and #stored == 40 and from > 0 then
      -- The share of the old window in use now, of the new window, rounded up.
      local du = us - now
      if du > 0 or (du == 0 and rem > 0) then
        local old_window = old_burst * old_token
        local old_ahead = du * from + rem
        local new_ahead = window
        if old_ahead < old_window then
          new_ahead = muldiv_ceil(old_ahead, window, old_window)
        end
        local whole = math.floor(new_ahead / d)
        us, rem = now + whole, new_ahead - whole * d
        carried[i] = true
      end
    elseif from ~= d and from > 0 then
      -- As time: rem < from <= 128000 and d <= 128000, so the product is exact.
      rem = math.floor((rem * d + from - 1) / from)
      if rem >= d then
        us, rem = us + 1, rem - d
      end
      rescaled = true
    end
    local du = us - now
    if du > 0 or (du == 0 and rem > 0) then
      if rescaled then carried[i] = true end
      -- Further ahead than any write leaves, unless the server's clock stepped back by weeks:
      -- refuse, with waits rounded up past the true ones.
      if du >= math.floor(4503599627370496 / d) then
        if not si then
          local cost_us = math.floor((math.min(ni, burst) * token + d - 1) / d)
          return { 0, 0, 0, du + 1 + cost_us, du + 1, i }
        end
        -- A shadow limit that far ahead has no room, and decides nothing else.
        du, rem = math.floor(window / d) + 1, 0
      end
      ahead, base_us, base_rem = du * d + rem, us, rem
    end
  end
  local o = 7 * i
  L[o - 6], L[o - 5], L[o - 4], L[o - 3], L[o - 2], L[o - 1], L[o] =
    token, window, d, ahead, base_us, base_rem, burst
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
else
  for i = 1, count do
    local o = 7 * i
    if N[i] > 0 and not S[i] and L[o - 3] + N[i] * L[o - 6] > L[o - 5] then allowed = 0 end
  end
end

local remaining, retry, reset, binding = -1, 0, 0, 1
local each = {}
local ends = {}
for i = 1, count do
  local o = 7 * i
  local token, window, d, ahead = L[o - 6], L[o - 5], L[o - 4], L[o - 3]
  local ti = take
  if mode ~= 1 then ti = N[i] end
  local after = ahead + ti * token
  -- This limit takes its tokens: the request passes, and a shadow limit has room of its own.
  local ok = allowed == 1 and (not S[i] or after <= window)
  local left, full, own_wait = 0, 0, 0
  if ok and ti > 0 then
    local rem = L[o - 1] + ti * token
    local whole = math.floor(rem / d)
    redis.call('SET', KEYS[i], struct.pack('ddddd', L[o - 2] + whole, rem - whole * d, d, token,
      L[o]), 'PX', expiry(after, d))
    ends[2 * i - 1], ends[2 * i] = L[o - 2] + whole, rem - whole * d
  elseif carried[i] then
    -- A carried state is written once, so that it is not carried again from a later reading.
    redis.call('SET', KEYS[i], struct.pack('ddddd', L[o - 2], L[o - 1], d, token, L[o]),
      'PX', expiry(ahead, d))
  end
  if ok then
    if window > after then left = math.floor((window - after) / token) end
    full = math.floor((after + d - 1) / d)
  else
    if window > ahead then left = math.floor((window - ahead) / token) end
    full = math.floor((ahead + d - 1) / d)
    if after > window then
      local wait = math.floor((after - window + d - 1) / d)
      if wait > retry then retry = wait end
      own_wait = wait
    end
  end
  if mode == 2 then
    each[4 * i - 3] = (after <= window) and 1 or 0
    each[4 * i - 2] = left
    each[4 * i - 1] = own_wait
    each[4 * i] = full
  end
  if remaining < 0 or left < remaining then remaining, binding = left, i end
  if full > reset then reset = full end
end

if allowed == 0 then take = 0 end
local reply = { allowed, take, remaining, retry, reset, binding }
if mode == 2 then
  for j = 1, 4 * count do reply[6 + j] = each[j] end
end
if mode == 3 and allowed == 1 and take > 0 then
  for j = 1, 2 * count do reply[6 + j] = ends[j] end
end
return reply
