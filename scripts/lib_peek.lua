-- lib_peek.lua: a part included by peek.lua and peek_batch.lua (not a script of its own).
--
-- peek_request is decide_request without recording or writing anything; its reset_after is 0
-- when the longest window holds no event, and its quota_after 0 when the tightest one holds
-- none.
local function peek_request(key, now, n, limits)
  local g = general()
  local log = g.read_log(key, read_header(key))
  local remaining, tightest, retry_after, count, _, quota_after = g.decide(log, now, n, limits, false)
  local reset_after = 0
  if count > 0 then
    reset_after = log.newest + math.max(limits[#limits - 1], log.horizon) - now
  end
  return remaining, retry_after, quota_after, reset_after, tightest, 1
end
