-- lib_decide.lua: a part included by decide.lua and decide_batch.lua (not a script of its own).
--
-- decide_request takes one decision: key's log, at now, a request of n events against limits
-- (flat (window, max) pairs, windows ascending), recorded when admitted, and the key's expiry
-- set. It returns the seven values decide.lua's reply documents, in its order.
local function decide_request(key, now, n, limits)
  local longest = limits[#limits - 1]
  local h = read_header(key)
  local remaining, tightest, retry_after, newest, seq, quota_after
  if #limits == 2 then
    remaining, tightest, retry_after, newest, seq, quota_after = decide_small(key, h, now, n, limits[1], limits[2])
  end
  if remaining == nil then
    local g = general()
    local log = g.read_log(key, h, true)
    local count
    remaining, tightest, retry_after, count, seq, quota_after = g.decide(log, now, n, limits, true)
    g.save(log)
    newest = log.newest
  end
  if retry_after > 0 then
    return remaining, now, retry_after, quota_after, newest + longest - now, tightest, 1
  end
  -- The log empties one longest window after its newest entry: the one added now, unless a
  -- caller's clock lags an entry another caller recorded. PEXPIRE takes whole milliseconds:
  -- round up so the key never goes before its newest entry.
  local reset_after = newest + longest - now
  redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
  return remaining, now, 0, quota_after, reset_after, tightest, seq
end
