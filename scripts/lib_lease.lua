-- lib_lease.lua: a part included by the lease scripts (not a script of its own).
--
-- A key's leases are one sorted set (a key that holds another type is refused: checked): a member per lease (its 16-byte id), scored by the
-- lease's expiry in integer microseconds, on the clock that granted it. A lease counts while
-- now < its expiry; at its expiry it frees its slot by itself, so a holder that dies without
-- releasing cannot keep a slot for longer than its lease.
--
-- keep_until(key, now, expires, fresh, server_clock) makes the key live at least until expires
-- (and no longer than needed when fresh: a key that had no lease before this one). Expiries
-- take whole milliseconds, rounded up so the key never goes before a lease it holds; GT only
-- ever lengthens the key's life, so a shorter lease never cuts a longer one's. On the
-- server's clock the expiry is absolute (PEXPIREAT): the key then goes with its last lease,
-- within the millisecond. On a caller's clock it is relative to now (PEXPIRE), as the
-- caller's clock may be far from the server's, and 2 ms longer: the server counts a relative
-- expiry from its time at the call's start, in whole milliseconds, which may lie up to one
-- millisecond (and one more across a boundary) before now.
local function keep_until(key, now, expires, fresh, server_clock)
  local cmd, at = 'PEXPIRE', math.ceil((expires - now) / 1000) + 2
  if server_clock then
    cmd, at = 'PEXPIREAT', math.ceil(expires / 1000)
  end
  if fresh then
    redis.call(cmd, key, at)
  else
    redis.call(cmd, key, at, 'GT')
  end
end

-- checked returns reply, the reply of a redis.pcall on key, unless it is an error: then it
-- raises BADLAYOUT when key holds another type than a sorted set (the key is not leases this
-- release wrote, and nothing is written to it), else the server's error.
local function checked(key, reply)
  if type(reply) == 'table' and reply.err ~= nil then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      error({err = 'BADLAYOUT the key holds a ' .. redis.call('TYPE', key).ok .. ', not strictrate leases'})
    end
    error(reply)
  end
  return reply
end
