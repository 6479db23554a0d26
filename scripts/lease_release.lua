-- lease_release.lua: gives a lease's slot back.
--
-- Removes the lease by its id and nothing else: ids are unique across processes, so a
-- release never frees another holder's slot. Releasing again, or a lease that expired (and
-- may already be gone), changes nothing more. The key disappears with its last lease.
--
-- KEYS[1]  the key's leases, as in lease_acquire.lua
-- ARGV[1]  the lease's id
--
-- Reply: 1 when the lease was in the set (held, or expired and not dropped yet), else 0; a key
-- that holds another type is BADLAYOUT (lib_lease.lua).

-- include: lib_lease.lua

return checked(KEYS[1], redis.pcall('ZREM', KEYS[1], ARGV[1]))
