#!lua flags=allow-cross-slot-keys
-- decide_all.lua: one all-or-nothing decision over several keys (the engine's AllowAll): every
-- request is peeked first, with its cost, as peek.lua takes it; only when every request that
-- is not advisory has room is each request with room decided, as decide.lua takes it, in KEYS
-- order. Nothing can interleave within one call, so each decision admits what its peek saw:
-- a denied group records nothing on any key, and an advisory request (a shadow rule) that
-- has no room records nothing and denies nothing else.
--
-- The first line is the script's flags (a shebang, Valkey 7 and later): allow-cross-slot-keys
-- lets one call reach keys of several slots of one node (a group of keys that a cluster keeps
-- on one primary); without allow-oom the server refuses the whole call when over maxmemory,
-- before it runs, so nothing is half recorded.
--
-- KEYS[i]  the log of request i, every key once: declared (a standalone server, or keys of one
--          slot), or, of several slots of the node the call goes to, passed in ARGV instead
--          (lib_keys.lua: numkeys 0, ARGV[1] their number, then the keys, then the ARGV below)
-- ARGV[1]  now in integer microseconds, the same for every request, or "" for the server's
--          clock (read once)
-- ARGV[2]  "decide", or "check": peek every request and record nothing (a group already
--          denied on another node)
-- ARGV[3]  the number of limit sets S, then S sets: a set's number of values L, then its L
--          values, decide.lua's limits in decimal (as its decimal ARGV[3..])
--          ... then per request, in KEYS order: its cost n (0: peeked, never recorded); the
--          1-based index of its set; "1" when it is advisory, else "0"
--
-- Reply: {the server's now (0 when the call carried its own now), a string of one byte per
-- request in KEYS order, "1" when that request was recorded, else "0"; then per request its
-- decision (a string, lib_reply.lua's encoding), or an error reply for a request that
-- failed (its key holds something else: BADLAYOUT; or is not on the node)}. A recorded
-- request's decision is decide.lua's (remaining after it, its entry's seq); every other one is
-- peek.lua's (remaining is the room now). A request that failed its peek records nothing, and
-- then no request of the call is recorded; one that failed its decision (the server refused a
-- write) stops the decisions there: the requests recorded before it say so, and the engine
-- gives them back.

-- include: lib_keys.lua
-- include: lib_request.lua
-- include: lib_reply.lua
-- include: lib_small.lua
-- include: lib_slot.lua
-- include: lib_log.lua
-- include: lib_decide.lua
-- include: lib_peek.lua

-- error_of is a failed call's error reply: what error() raised, a table carrying err or a
-- message.
local function error_of(e)
  if type(e) == 'table' and e.err ~= nil then
    e = e.err
  end
  return {err = tostring(e)}
end

local sets, a = {}, 4
for s = 1, tonumber(ARGV[3]) do
  local count, limits = tonumber(ARGV[a]), {}
  for j = 1, count do
    limits[j] = tonumber(ARGV[a + j])
  end
  sets[s] = limits
  a = a + 1 + count
end
local now, server_clock = read_clock(ARGV[1])
local server_now = 0
if server_clock then
  server_now = now
end

-- The peeks: every request, with its cost.
local reqs, admit = {}, ARGV[2] == 'decide'
for i = 1, #KEYS do
  local r = {n = tonumber(ARGV[a]), limits = sets[tonumber(ARGV[a + 1])], advisory = ARGV[a + 2] == '1'}
  a = a + 3
  local ok, remaining, retry, quota, reset, tightest, seq = pcall(peek_request, KEYS[i], now, r.n, r.limits)
  if ok then
    r.room = retry == 0
    r.decision = encode_decision(r.limits, remaining, retry, quota, reset, tightest, seq)
    if not r.room and not r.advisory then
      admit = false
    end
  else
    r.decision = error_of(remaining)
    admit = false
  end
  reqs[i] = r
end

-- The decisions: only when every request that is not advisory has room, and then each request
-- with room and a cost.
local recorded = {}
for i = 1, #KEYS do
  recorded[i] = '0'
end
if admit then
  for i = 1, #KEYS do
    local r = reqs[i]
    if r.room and r.n > 0 then
      local ok, remaining, retry, quota, reset, tightest, seq = pcall(decide_request, KEYS[i], now, r.n, r.limits, server_clock)
      if not ok then
        r.decision = error_of(remaining)
        break
      end
      r.decision = encode_decision(r.limits, remaining, retry, quota, reset, tightest, seq)
      if retry == 0 then
        recorded[i] = '1'
      end
    end
  end
end

local reply = {server_now, table.concat(recorded)}
for i = 1, #KEYS do
  reply[i + 2] = reqs[i].decision
end
return reply
