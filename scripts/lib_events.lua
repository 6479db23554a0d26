-- lib_events.lua: a part included by the decision scripts (not a script of its own).
--
-- add_events(key, now, n, seq) adds n events at now to the key's sorted set. Members are unique
-- within the key: the bare timestamp for the first event of a microsecond (a decimal integer,
-- which a listpack stores in 9 bytes), "<now>:<seq>" for the rest, counting on from seq (the
-- log's size before the add is a good start). ZADD NX reports how many were new, so a taken
-- member is retried, never overwritten.
--
-- A number argument reaches the server as its exact integer digits; Lua's own tostring would
-- round it to 14 digits, so the rare path formats the stamp with %d.
local function add_events(key, now, n, seq)
  if n == 1 and redis.call('ZADD', key, 'NX', now, now) == 1 then
    return
  end
  local stamp = string.format('%d', now)
  local added = 0
  local bare = n > 1 -- with n = 1 the bare timestamp was just found taken
  while added < n do
    -- At most 1000 members per ZADD keeps the argument list well inside Lua's stack.
    local batch = n - added
    if batch > 1000 then batch = 1000 end
    local cmd = {'ZADD', key, 'NX'}
    for _ = 1, batch do
      local member
      if bare then
        member = stamp
        bare = false
      else
        seq = seq + 1
        member = stamp .. ':' .. seq
      end
      cmd[#cmd + 1] = now
      cmd[#cmd + 1] = member
    end
    added = added + redis.call(unpack(cmd))
  end
end
