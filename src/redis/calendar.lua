-- A fixed window on UTC calendar boundaries for one subject, decided atomically on the server's
-- clock: the Lua twin of the crate's `window/civil.rs` and `window/calendar.rs`.
--
-- KEYS[1]  the subject's key for this window.
-- ARGV     period (0 minute, 1 hour, 2 day, 3 ISO week, 4 month, 5 year), limit, n.
--
-- Time is whole microseconds since the Unix epoch (about 2^51 today); days, months and counts are
-- small integers: every figure is exact in a double. The state is the period's index plus one and
-- the count taken in it, packed as two doubles; it expires when its period ends. A state of a
-- later period (the server's clock stepped back, as after a failover to a replica behind) is kept
-- and decided in, so a period already over is never reopened.
--
-- Reply: { allowed (1 or 0), remaining, retry_us (0 when allowed), reset_us (0 when empty) }.

local MINUTE, HOUR, DAY = 60000000, 3600000000, 86400000000
local BEFORE_MONTH = { 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334 }

local function leaps_through(y)
  return math.floor(y / 4) - math.floor(y / 100) + math.floor(y / 400)
end

local function before_year(y)
  return 365 * (y - 1970) + leaps_through(y - 1) - leaps_through(1969)
end

local function is_leap(y)
  return y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0)
end

local function before_month(m, leap)
  local d = BEFORE_MONTH[m]
  if leap and m > 2 then d = d + 1 end
  return d
end

local function year_month(days)
  local y = 1970 + math.floor(days / 366)
  while before_year(y + 1) <= days do y = y + 1 end
  local into, leap, m = days - before_year(y), is_leap(y), 12
  while before_month(m, leap) > into do m = m - 1 end
  return y, m
end

-- The period holding `now`: its index, and the microsecond it ends.
local function window(period, now)
  if period <= 2 then
    local len = ({ MINUTE, HOUR, DAY })[period + 1]
    local index = math.floor(now / len)
    return index, (index + 1) * len
  end
  local days = math.floor(now / DAY)
  if period == 3 then
    local index = math.floor((days + 3) / 7)
    return index, (index * 7 + 4) * DAY
  end
  local y, m = year_month(days)
  if period == 4 then
    local finish = before_year(y + 1)
    if m < 12 then finish = before_year(y) + before_month(m + 1, is_leap(y)) end
    return (y - 1970) * 12 + m - 1, finish * DAY
  end
  return y - 1970, before_year(y + 1) * DAY
end

local now = server_now()
local period, limit, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local index, finish = window(period, now)
local current, count, later = index + 1, 0, false
local stored = redis.call('GET', KEYS[1])
if stored and #stored == 16 then
  local at, taken = struct.unpack('dd', stored)
  if at >= current then
    current, count, later = at, taken, at > index + 1
  end
end
local allowed = n == 0 or count + n <= limit
if n > 0 and allowed then
  count = count + n
  if later then
    redis.call('SET', KEYS[1], struct.pack('dd', current, count), 'KEEPTTL')
  else
    local px = expiry(finish - now, 1)
    redis.call('SET', KEYS[1], struct.pack('dd', current, count), 'PX', px)
  end
end
local to_end = math.max(1, finish - now)
local retry, reset = 0, 0
if not allowed then retry = to_end end
if count > 0 then reset = to_end end
return { allowed and 1 or 0, limit - count, retry, reset }
