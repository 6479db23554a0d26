-- lib_batch.lua: a part included by the batch scripts (not a script of its own).
--
-- run_batch runs decide for every request of a batch script's call, in KEYS order, and
-- returns the batch reply. ARGV (decide_batch.lua documents it): "" when every request uses
-- the server's clock (read once, shared), else "each"; the number of limit sets; each set (its
-- number of limits, then the (window, max) pairs); then per request its cost n, the 1-based
-- index of its set, and, with "each", its now. The reply: the server's now (0 when unread), then
-- per request either a count c and c values (decide's remaining, retry_after, quota_after,
-- reset_after, tightest and seq, trailing defaults left out: 0, the tightest limit's window,
-- the longest window, 1, 1), or an error
-- reply for a request that failed. A failed request is caught on its own: the others are taken
-- as if it were not there.
local function run_batch(decide)
  local sets, a = {}, 3
  for s = 1, tonumber(ARGV[2]) do
    local count, limits = tonumber(ARGV[a]), {}
    for j = 1, 2 * count do
      limits[j] = tonumber(ARGV[a + j])
    end
    sets[s] = limits
    a = a + 1 + 2 * count
  end
  local each, server_now = ARGV[1] == 'each', 0
  if not each then
    server_now = read_clock('')
  end
  local reply, r = {server_now}, 1
  for i = 1, #KEYS do
    local n, limits, now = tonumber(ARGV[a]), sets[tonumber(ARGV[a + 1])], server_now
    a = a + 2
    if each then
      now = read_clock(ARGV[a])
      a = a + 1
    end
    local ok, remaining, _, retry, quota, reset, tightest, seq = pcall(decide, KEYS[i], now, n, limits)
    if not ok then
      if type(remaining) == 'table' and remaining.err ~= nil then
        remaining = remaining.err
      end
      reply[r + 1] = {err = tostring(remaining)}
      r = r + 1
    elseif seq ~= 1 then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6], reply[r + 7] = 6, remaining, retry, quota, reset, tightest, seq
      r = r + 7
    elseif tightest ~= 1 then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] = 5, remaining, retry, quota, reset, tightest
      r = r + 6
    elseif retry ~= 0 or reset ~= limits[#limits - 1] then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5] = 4, remaining, retry, quota, reset
      r = r + 5
    elseif quota ~= limits[1] then
      reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 3, remaining, 0, quota
      r = r + 4
    else
      reply[r + 1], reply[r + 2] = 1, remaining
      r = r + 2
    end
  end
  return reply
end
