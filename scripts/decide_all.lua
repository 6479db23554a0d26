#!lua flags=allow-cross-slot-keys
-- decide_all.lua: all-or-nothing decisions over several keys (the engine's AllowAll), one group
-- of requests each, one or several groups a call: every request of a group is peeked first,
-- with its cost, as peek.lua takes it; only when every request of the group that is not
-- advisory has room is each request with room decided, as decide.lua takes it (one of them,
-- the group's lead, is decided without a peek: see below). Nothing can interleave within one
-- call, so each decision admits what its peek saw: a denied group records nothing on any key,
-- and an advisory request (a shadow rule) that has no room records nothing and denies nothing
-- else.
--
-- The first line is the script's flags (a shebang, Valkey 7 and later): allow-cross-slot-keys
-- lets one call reach keys of several slots of one node (a group of keys that a cluster keeps
-- on one primary); without allow-oom the server refuses the whole call when over maxmemory,
-- before it runs, so nothing is half recorded.
--
-- KEYS     the logs of every group's requests, group after group, each group's in its order
--          (no key twice within a group; groups may share keys): declared (a standalone
--          server, or keys of one slot), or, of several slots of the node the call goes to,
--          passed in ARGV instead (lib_keys.lua: numkeys 0, ARGV[1] their number, then the
--          keys, then the ARGV below)
-- ARGV[1]  the number of limit sets S, then S sets: a set's number of values L, then its L
--          values, decide.lua's limits in decimal (as its decimal ARGV[3..])
--          ... then the number of groups G, then per group: its now in integer microseconds,
--          or "" for the server's clock (read once, shared by every such group of the call);
--          "decide", or "check": peek every request and record nothing (a group already
--          denied on another node); its number of requests k; then per request of the group,
--          in KEYS order: its cost n (0: peeked, never recorded); the 1-based index of its
--          set; "1" when it is advisory, else "0"
--
-- The groups are decided one after the other, in order, each all or nothing on its own: a
-- call of several groups is the group commit of several AllowAll decisions (the engine's
-- WithBatching), each seeing what the groups before it recorded.
--
-- Reply: {the server's now (0 when no group took the server's clock), then per group: a
-- string of one byte per request of the group, "1" when that request was recorded, else
-- "0"; then per request its decision (a string, lib_reply.lua's encoding), or an error reply
-- for a request that failed (its key holds something else: BADLAYOUT; or is not on the
-- node)}. A recorded request's decision is decide.lua's (remaining after it, its entry's seq);
-- every other one is peek.lua's (remaining is the room now). A request that failed its peek
-- records nothing, and then no request of its group is recorded; one that failed its decision
-- (the server refused a write) stops its group's decisions there: the requests recorded before
-- it say so, and the engine gives them back. Either leaves the other groups as they are.

-- include: lib_keys.lua
-- include: lib_sets.lua
-- include: lib_request.lua
-- include: lib_reply.lua
-- include: lib_small.lua
-- include: lib_slot.lua
-- include: lib_busy_elements.lua
-- include: lib_busy.lua
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

local sets, a = read_sets(1)
-- weight is what a request's peek would cost the server, for choosing its group's lead (the
-- request decided without a peek): 2 for a log that takes the general path (lib_log.lua), 1
-- for a header that peek_small or peek_busy reads (lib_peek.lua, lib_busy.lua), 0 for no log.
local function weight(r)
  local h = r.header
  if type(h) ~= 'string' then
    return 0
  end
  local kind = string.byte(h, 1)
  if (kind == KIND_V or kind == KIND_U or kind == KIND_K)
    and one_limit(r.limits) ~= nil then
    return 1
  end
  return 2
end

-- run_one runs f (peek_request or decide_request) for r at now and keeps its decision on r. It
-- returns the decision's retry (0: r had room), or nil when f failed (the server refused a
-- write), r's decision then the error.
local function run_one(f, r, now, server_clock)
  local ok, remaining, retry, quota, reset, tightest, seq = pcall(f, r.key, now, r.n, r.limits, server_clock, r.header)
  if not ok then
    r.decision = error_of(remaining)
    return nil
  end
  r.decision = encode_decision(r.limits, remaining, retry, quota, reset, tightest, seq)
  return retry
end

-- peek_one peeks r at now, its cost included, and keeps its decision (and r.room) on r. It
-- returns false when r denies its group: it has no room and is not advisory, or its peek
-- failed.
local function peek_one(r, now, server_clock)
  local retry = run_one(peek_request, r, now, server_clock)
  if retry == nil then
    return false
  end
  r.room = retry == 0
  return r.room or r.advisory
end

-- decide_one decides r at now and keeps its decision on r, with r.recorded when it admitted.
-- It returns false when the decision failed (the server refused a write), else true and
-- whether r had room.
local function decide_one(r, now, server_clock)
  local retry = run_one(decide_request, r, now, server_clock)
  if retry == nil then
    return false
  end
  r.recorded = retry == 0
  return true, r.recorded
end

local groups = tonumber(ARGV[a])
a = a + 1

local server_now, reply, first = 0, {0}, 1
for _ = 1, groups do
  local now, server_clock = tonumber(ARGV[a]), false
  if now == nil then
    if server_now == 0 then
      server_now = read_clock('')
      reply[1] = server_now
    end
    now, server_clock = server_now, true
  end
  local admit, k = ARGV[a + 1] == 'decide', tonumber(ARGV[a + 2])
  a = a + 3

  -- The headers, then the request decided without a peek (lead, below).
  local reqs, lead, lead_weight = {}, nil, -1
  for i = 1, k do
    local r = {key = KEYS[first + i - 1], n = tonumber(ARGV[a]), limits = sets[tonumber(ARGV[a + 1])], advisory = ARGV[a + 2] == '1'}
    a = a + 3
    r.header = read_header(r.key)
    reqs[i] = r
    if admit and r.n > 0 and not r.advisory then
      local w = weight(r)
      if w > lead_weight then
        lead, lead_weight = i, w
      end
    end
  end

  -- The peeks: every request of the group but the lead, with its cost. A peek's header serves
  -- its decision: nothing writes that key in between.
  for i = 1, k do
    if i ~= lead and not peek_one(reqs[i], now, server_clock) then
      admit = false
    end
  end

  -- The lead is decided once every other request is known to have room: when it has none too,
  -- its decision records nothing and denies the group (a denial says what its peek would), and
  -- else it is recorded first. Keys are distinct within a group, so the order of the group's
  -- decisions changes nothing. The lead is the request whose peek would cost the most, one
  -- with a cost that is not advisory: a group pays for one peek fewer than it has requests.
  if lead ~= nil then
    if not admit then
      peek_one(reqs[lead], now, server_clock)
    else
      local ok, room = decide_one(reqs[lead], now, server_clock)
      admit = ok and room
    end
  end

  -- The decisions: only when every request of the group that is not advisory has room, and
  -- then each other request with room and a cost.
  if admit then
    for i = 1, k do
      local r = reqs[i]
      if i ~= lead and r.room and r.n > 0 and not decide_one(r, now, server_clock) then
        break
      end
    end
  end

  local recorded = {}
  for i = 1, k do
    recorded[i] = reqs[i].recorded and '1' or '0'
  end
  reply[#reply + 1] = table.concat(recorded)
  for i = 1, k do
    reply[#reply + 1] = reqs[i].decision
  end
  first = first + k
end
return reply
