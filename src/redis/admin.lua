-- An operator's change of one subject, or a charge's settlement, under one or more limits,
-- decided atomically on the server's clock; the state is the GCRA script's (gcra.lua), read and
-- written in its packed form.
--
-- KEYS[i]  the subject's key for limit i (one hash slot, as gcra.lua's).
-- ARGV     op, then for each limit five numbers: token, burst, denom (the quota in force, as
--          gcra.lua takes it), and two that depend on the op:
--            1 settle:   the TAT the charge left (whole us, remainder), then after every limit's
--                        five: tokens taken, tokens actually owed
--            2 penalize: 0, 0, then the tokens owed
--            3 block:    0, 0, then the microseconds to refuse for
--            4 remove:   0, 0 (the keys are deleted: a missing key is a full limit)
--
-- A settlement owes an excess as debt, in the units of the quota the state was written under,
-- and gives a surplus back only while the state is still the TAT the charge wrote (the charge is
-- the subject's latest change), under the quota it was charged under; otherwise nothing comes
-- back, which can only under-admit. A state never falls behind now (a full limit
-- cannot be fuller), and no debt is pushed further than 2^50 units past the window: every figure
-- stays an exact integer in a double (the window is below 2^51 units).
--
-- Reply: { how many keys changed }.

local now = server_now()
local op = tonumber(ARGV[1])
local count = #KEYS
local tail = 1 + 5 * count
local changed = 0

if op == 4 then
  for i = 1, count do changed = changed + redis.call('DEL', KEYS[i]) end
  return { changed }
end

for i = 1, count do
  local a = 5 * i - 3
  local token, burst, d = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local end_us, end_rem = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  -- The state and the quota it was written under (none: a full limit under this call's quota).
  local us, rem, from, old_token, old_burst = now, 0, d, token, burst
  local stored = redis.call('GET', KEYS[i])
  local same = true
  if stored and #stored == 40 then
    us, rem, from, old_token, old_burst = struct.unpack('ddddd', stored)
    same = from == d and old_token == token and old_burst == burst
  elseif stored and (#stored == 16 or #stored == 24) then
    -- Written before quotas were stored beside the state: left to gcra.lua to carry over.
    from = -1
  end
  if from > 0 then
    local window = old_burst * old_token
    local limit = window + 1125899906842624 -- 2^50
    -- Debt ahead of now, in the state's units, and where it stands (behind now: a full limit).
    local ahead = (us - now) * from + rem
    if ahead < 0 then ahead, us, rem = 0, now, 0 end
    local want = ahead
    if op == 1 then
      local taken, owed = tonumber(ARGV[tail + 1]), tonumber(ARGV[tail + 2])
      if owed > taken then
        want = ahead + (owed - taken) * old_token
      elseif owed < taken and same and us == end_us and rem == end_rem then
        -- Only while the state is still the one the charge wrote (its latest change); never
        -- behind now.
        want = math.max(0, ahead - (taken - owed) * token)
      end
    elseif op == 2 then
      want = ahead + tonumber(ARGV[tail + 1]) * old_token
    elseif op == 3 then
      local block = tonumber(ARGV[tail + 1])
      if block > 0 then
        -- One token waits exactly `block` us: the debt at which it passes then.
        want = math.max(ahead, math.min(block * from, limit) + window - old_token)
      end
    end
    if want > limit then want = math.max(ahead, limit) end
    if want ~= ahead then
      local whole = math.floor(want / from)
      redis.call('SET', KEYS[i], struct.pack('ddddd', now + whole, want - whole * from, from,
        old_token, old_burst), 'PX', expiry(want, from))
      changed = changed + 1
    end
  end
end
return { changed }
