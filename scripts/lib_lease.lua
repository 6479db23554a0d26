-- lib_lease.lua: a part included by the lease scripts (not a script of its own).
--
-- A key's leases are one sorted set: a member per lease (its 16-byte id), scored by the
-- lease's expiry in integer microseconds, on the clock that granted it. A lease counts while
-- now < its expiry; at its expiry it frees its slot by itself, so a holder that dies without
-- releasing cannot keep a slot for longer than its lease.
--
-- keep_until(key, now, expires, fresh) makes the key live at least until expires (and no
-- longer than needed when fresh: a key that had no lease before this one). PEXPIRE takes whole
-- milliseconds, rounded up so the key never goes before a lease it holds; GT only ever
-- lengthens the key's life, so a shorter lease never cuts a longer one's.
local function keep_until(key, now, expires, fresh)
  local ms = math.ceil((expires - now) / 1000)
  if fresh then
    redis.call('PEXPIRE', key, ms)
  else
    redis.call('PEXPIRE', key, ms, 'GT')
  end
end
