-- lib_decide.lua: a part included by decide.lua and decide_batch.lua (not a script of its own).
--
-- decide_request takes one decision: key's log, at now, a request of n events against limits
-- (flat (window, max) pairs, windows ascending), recorded when admitted, and the key's expiry
-- set. It returns the six values of a decision, in lib_reply.lua's order.
local function decide_request(key, now, n, limits)
  -- reach: the longest window ever counted on the key (its horizon), this call's included.
  local reach = limits[#limits - 1]
  local h = read_header(key)
  local remaining, tightest, retry_after, newest, seq, quota_after
  if #limits == 2 then
    remaining, tightest, retry_after, newest, seq, quota_after = decide_small(key, h, now, n, limits[1], limits[2])
  end
  local grew, expiry_set = false, h ~= false and type(h) ~= 'table'
  if remaining == nil then
    local g = general()
    local log = g.read_log(key, h)
    local count
    remaining, tightest, retry_after, count, seq, quota_after = g.decide(log, now, n, limits, true)
    g.save(log)
    newest, reach, grew, expiry_set = log.newest, log.horizon, log.horizon_grew, log.expiry_set
  end
  if retry_after > 0 then
    local reset_after = newest + reach - now
    if grew and reset_after > 0 then
      -- A longer window now counts on the key: its entries must outlive the expiry a
      -- shorter one set.
      redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
    end
    return remaining, retry_after, quota_after, reset_after, tightest, 1
  end
  -- The log empties one horizon after its newest entry: the one added now, unless a caller's
  -- clock lags an entry another caller recorded. PEXPIRE takes whole milliseconds: round up so
  -- the key never goes before its newest entry.
  local reset_after = newest + reach - now
  if not expiry_set then
    -- A key this call made: without its expiry it would outlive every window. Refused, the
    -- key goes again, and the call records nothing.
    local ok, err = pcall(redis.call, 'PEXPIRE', key, math.ceil(reset_after / 1000))
    if not ok then
      redis.call('DEL', key)
      error(err)
    end
  end
  return remaining, 0, quota_after, reset_after, tightest, seq
end
