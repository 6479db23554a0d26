-- lib_batch.lua: a part included by decide_batch.lua and peek_batch.lua (not a script of its
-- own), after lib_sets.lua.
--
-- run_batch runs decide (key, now, n, limits, and whether now is the server's clock) for every
-- request of a batch script's call, in KEYS order, and returns the reply lib_reply.lua
-- encodes, one decision per request. ARGV (decide_batch.lua documents it): "" when every
-- request uses the server's clock (read once, shared), else "each"; the limit sets
-- (read_sets); then per request its cost n, the 1-based index of its set, and, with "each",
-- its now. A failed request is caught on its own: the others are taken as if it were not
-- there.
local function run_batch(decide)
  local sets, a = read_sets(2)
  local each, server_now = ARGV[1] == 'each', 0
  if not each then
    server_now = read_clock('')
  end
  local reply = {server_now}
  for i = 1, #KEYS do
    local n, limits, now, from_server = tonumber(ARGV[a]), sets[tonumber(ARGV[a + 1])], server_now, not each
    a = a + 2
    if each then
      now, from_server = read_clock(ARGV[a])
      a = a + 1
    end
    local ok, remaining, retry, quota, reset, tightest, seq = pcall(decide, KEYS[i], now, n, limits, from_server)
    if ok then
      reply[i + 1] = encode_decision(limits, remaining, retry, quota, reset, tightest, seq)
    else
      -- A failed request's error reply: what error() raised, a table carrying err or a message.
      if type(remaining) == 'table' and remaining.err ~= nil then
        remaining = remaining.err
      end
      reply[i + 1] = {err = tostring(remaining)}
    end
  end
  return reply
end
