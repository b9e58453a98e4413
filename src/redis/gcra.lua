-- GCRA for one subject under one or more limits, decided atomically on the server's clock.
--
-- KEYS[i]  the subject's key for limit i (all in one hash slot: the caller puts the subject in a
--          {hash tag}).
-- ARGV     mode (0: all n or nothing; 1: grant up to n), n, then for each limit: token_us,
--          token_rem, denom, burst. One token lasts token_us + token_rem / denom microseconds.
--
-- Lua numbers are doubles, so every quantity here is an integer below 2^53: time is whole
-- microseconds since the Unix epoch (about 2^51 today) plus a remainder in 1/denom us, and the
-- caller keeps each limit's window (burst tokens) below 2^50 us. The TAT is stored as the string
-- "<us> <remainder>", with a PX expiry at the instant the limit is full again.
--
-- Reply: { allowed (1 or 0; 2 when n exceeds a limit's burst), granted, remaining, retry_us
-- (rounded up), reset_us (rounded up), index of the limit that binds (or whose burst n exceeds) }.

local function norm(u, r, d)
  local q = math.floor(r / d)
  return u + q, r - q * d
end

local function mul(u, r, k, d)
  return norm(u * k, r * k, d)
end

local function less(au, ar, bu, br)
  return au < bu or (au == bu and ar < br)
end

local function ceil_us(u, r)
  if r > 0 then return u + 1 end
  return u
end

-- Whole tokens of (tu, tr) that fit in (xu, xr), at most cap: a float estimate, made exact.
local function fits(xu, xr, tu, tr, d, cap)
  if xu < 0 then return 0 end
  local k = math.floor((xu + xr / d) / (tu + tr / d))
  if k > cap then k = cap end
  if k < 0 then k = 0 end
  while k > 0 do
    local cu, cr = mul(tu, tr, k, d)
    if not less(xu, xr, cu, cr) then break end
    k = k - 1
  end
  while k < cap do
    local cu, cr = mul(tu, tr, k + 1, d)
    if less(xu, xr, cu, cr) then break end
    k = k + 1
  end
  return k
end

local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local now = server_now()
local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local limits = {}
local grant = n

for i = 1, #KEYS do
  local a = 2 + (i - 1) * 4
  local l = {
    tu = tonumber(ARGV[a + 1]), tr = tonumber(ARGV[a + 2]),
    d = tonumber(ARGV[a + 3]), burst = tonumber(ARGV[a + 4]),
  }
  if mode == 0 and n > l.burst then
    return { 2, 0, 0, 0, 0, i }
  end
  l.wu, l.wr = mul(l.tu, l.tr, l.burst, l.d)
  -- A TAT behind now is a full limit: new debt starts from now.
  l.bu, l.br, l.au, l.ar = now, 0, 0, 0
  local stored = redis.call('GET', KEYS[i])
  if stored then
    local su, sr = string.match(stored, '^(%d+) (%d+)$')
    if su then
      su, sr = tonumber(su), tonumber(sr)
      local du, dr = norm(su - now, sr, l.d)
      if du > 0 or (du == 0 and dr > 0) then
        l.bu, l.br, l.au, l.ar = su, sr, du, dr
      end
    end
  end
  if mode == 1 then
    local xu, xr = norm(l.wu - l.au, l.wr - l.ar, l.d)
    local cap = n
    if cap > l.burst then cap = l.burst end
    local k = fits(xu, xr, l.tu, l.tr, l.d, cap)
    if k < grant then grant = k end
  end
  limits[i] = l
end

-- Tokens this request asks of every limit: n, or in mode 1 what all of them can give (and when
-- none can, the one token whose wait the refusal reports).
local take = n
if mode == 1 then
  take = grant
  if grant == 0 and n > 0 then take = 1 end
end

local allowed = 1
for i = 1, #limits do
  local l = limits[i]
  l.cu, l.cr = mul(l.tu, l.tr, take, l.d)
  l.fu, l.fr = norm(l.au + l.cu, l.ar + l.cr, l.d)
  if n > 0 and less(l.wu, l.wr, l.fu, l.fr) then allowed = 0 end
end
if mode == 1 and grant == 0 and n > 0 then allowed = 0 end

local remaining, retry, reset, binding = -1, 0, 0, 1
for i = 1, #limits do
  local l = limits[i]
  local left, full
  if allowed == 1 then
    if take > 0 then
      local tu, tr = norm(l.bu + l.cu, l.br + l.cr, l.d)
      local px = math.floor((ceil_us(l.fu, l.fr) + 999) / 1000)
      redis.call('SET', KEYS[i], string.format('%.0f %.0f', tu, tr), 'PX', string.format('%.0f', px))
    end
    local xu, xr = norm(l.wu - l.fu, l.wr - l.fr, l.d)
    left = fits(xu, xr, l.tu, l.tr, l.d, l.burst)
    full = ceil_us(l.fu, l.fr)
  else
    local xu, xr = norm(l.wu - l.au, l.wr - l.ar, l.d)
    left = fits(xu, xr, l.tu, l.tr, l.d, l.burst)
    full = ceil_us(l.au, l.ar)
    if less(l.wu, l.wr, l.fu, l.fr) then
      local wu, wr = norm(l.fu - l.wu, l.fr - l.wr, l.d)
      local wait = ceil_us(wu, wr)
      if wait > retry then retry = wait end
    end
  end
  if remaining < 0 or left < remaining then remaining, binding = left, i end
  if full > reset then reset = full end
end

if allowed == 0 then take = 0 end
return { allowed, take, remaining, retry, reset, binding }
