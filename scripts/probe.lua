-- probe.lua: which of the commands the engine's scripts run this connection's user may not
-- run on the engine's keys. New runs it once, as EVALSHA and as EVALSHA_RO, so that a user
-- whose ACL forbids a command the scripts need is refused at New, not by the first decision
-- (or, worse, midway through one, after part of its writes). It runs none of them: it asks
-- the server's ACL (redis.acl_check_cmd), and writes nothing.
--
-- KEYS     none: the keys below are only named to the ACL, never read, so the probe runs on
--          any node of a cluster
-- ARGV[1]  a key of the engine's logs (under its prefix): the log commands are checked on it
-- ARGV[2]  a key of the engine's leases (under its lease namespace)
-- ARGV[3]  "1" to check the commands of the writing scripts too, "" for the read-only ones
--
-- Reply: an array of strings: each command the user may not run, as "COMMAND key"; empty
-- when it may run them all.

local log, lease, writes = ARGV[1], ARGV[2], ARGV[3] == '1'
local checks = {
  {'TIME'},
  {'LINDEX', log, '0'},
  {'LRANGE', log, '0', '0'},
  {'LLEN', log},
  {'TYPE', log},
}
if writes then
  local more = {
    {'LSET', log, '0', 'x'},
    {'RPUSH', log, 'x'},
    {'LINSERT', log, 'BEFORE', 'x', 'x'},
    {'LREM', log, '1', 'x'},
    {'LTRIM', log, '0', '0'},
    {'DEL', log},
    {'PEXPIRE', log, '1'},
    {'PEXPIREAT', log, '1'},
    {'TYPE', lease},
    {'ZREMRANGEBYSCORE', lease, '0', '0'},
    {'ZCARD', lease},
    {'ZRANGE', lease, '0', '0'},
    {'ZADD', lease, '0', 'x'},
    {'ZSCORE', lease, 'x'},
    {'ZREM', lease, 'x'},
    {'PEXPIRE', lease, '1'},
    {'PEXPIREAT', lease, '1'},
  }
  for _, c in ipairs(more) do
    checks[#checks + 1] = c
  end
end
local denied = {}
for _, c in ipairs(checks) do
  if not redis.acl_check_cmd(unpack(c)) then
    denied[#denied + 1] = c[1] .. ' ' .. (c[2] or '')
  end
end
return denied
