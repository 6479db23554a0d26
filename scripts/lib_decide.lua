-- lib_decide.lua: a part included by decide.lua and decide_batch.lua (not a script of its own).
--
-- decide_request takes one decision: key's log, at now, a request of n events against limits
-- (flat (window, max) pairs, windows ascending), recorded when admitted, and the key's expiry
-- set. server_clock says whether now is the server's clock; h is the key's header when the
-- caller has read it (read_header), nil else. It returns
-- the six values of a decision, in lib_reply.lua's order: decide_small's or decide_busy's
-- when one takes the request, else the general path's.
local function decide_request(key, now, n, limits, server_clock, h)
  if h == nil then
    h = read_header(key)
  end
  if #limits == 2 then
    local remaining, retry_after, quota_after, reset_after, tightest, seq = decide_small(key, h, now, n, limits[1], limits[2], server_clock)
    if remaining ~= nil then
      return remaining, retry_after, quota_after, reset_after, tightest, seq
    end
    remaining, retry_after, quota_after, reset_after, tightest, seq = decide_busy(key, h, now, n, limits[1], limits[2], server_clock)
    if remaining ~= nil then
      return remaining, retry_after, quota_after, reset_after, tightest, seq
    end
  end
  if #limits == 4 and limits[1] == -1 then
    local remaining, retry_after, quota_after, reset_after, tightest, seq = merge_small(key, h, now, n, limits[2], limits[3], limits[4], server_clock)
    if remaining == nil then
      remaining, retry_after, quota_after, reset_after, tightest, seq = decide_busy(key, h, now, n, limits[3], limits[4], server_clock, limits[2])
    end
    if remaining ~= nil then
      return remaining, retry_after, quota_after, reset_after, tightest, seq
    end
  end
  local g = general()
  local log = g.read_log(key, h)
  log.server_clock = server_clock
  local remaining, tightest, retry_after, _, seq, quota_after = g.decide(log, now, n, limits, true)
  g.save(log)
  -- The log empties at its newest entry plus the longest window ever counted on the key (its
  -- horizon, this call's included), or when the last period a counter holds events in ends.
  local reset_at = g.reset_at(log, log.horizon)
  local reset_after = 0
  if reset_at > now then
    reset_after = reset_at - now
  end
  if retry_after > 0 and not limits.charge then
    if (log.horizon_grew or log.created) and reset_after > 0 then
      -- A longer window now counts on the key: its entries must outlive the expiry a
      -- shorter one set. Or the key was made anew (its counters kept, its entries gone).
      keep_log_until(key, now, reset_at, server_clock)
    end
    return remaining, retry_after, quota_after, reset_after, tightest, 1
  end
  -- The log empties one horizon after its newest entry: the one added now, unless a caller's
  -- clock lags an entry another caller recorded (keep_log_until, lib_log.lua).
  if not log.expiry_set then
    -- A key this call made: without its expiry it would outlive every window. Refused, the
    -- key goes again, and the call records nothing.
    local ok, err = pcall(keep_log_until, key, now, reset_at, server_clock)
    if not ok then
      redis.call('DEL', key)
      error(err)
    end
  end
  return remaining, retry_after, quota_after, reset_after, tightest, seq
end
