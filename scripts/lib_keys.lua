-- lib_keys.lua: a part included first by the batch scripts (not a script of its own).
--
-- A batch sent to one node of a cluster holds keys of several slots of that node. The server
-- refuses a call whose declared keys are of several slots (CROSSSLOT) before the script runs,
-- whatever the script's flags: allow-cross-slot-keys lets a script reach keys it did not
-- declare, not declare keys of several slots. Such a call declares no key (numkeys 0) and
-- passes its keys first in ARGV: ARGV[1] their number k, ARGV[2] to ARGV[k + 1] the keys, then
-- the arguments the script documents. The two locals below give the rest of the script KEYS
-- and ARGV as they are when the keys are declared (every part included after this one sees
-- them in place of the globals), so a call that declares its keys (numkeys > 0: a standalone
-- server, or every key of the call in one slot) is read as it is.
--
-- The server checks an undeclared key when a command reaches it: a key of a slot the node
-- does not serve (another node's, or migrating away and not here) fails that command with
-- "Script attempted to access a non local key in a cluster node". Every command on the key
-- fails alike (a script runs alone: the slot's owner cannot change under it), so its request
-- fails on its first command, and run_batch catches it for that request alone; the engine
-- sends that request again on its own. The one way a key stops being local midway is the
-- script deleting it in a migrating slot, and the scripts delete a log only when none of its
-- entries counts any more (every one left its window) or when they made the key in this very
-- call: what such a failed request leaves behind counts nothing.
local KEYS, ARGV = KEYS, ARGV
if #KEYS == 0 and #ARGV > 0 then
  local k, keys, args = tonumber(ARGV[1]), {}, {}
  for i = 1, k do
    keys[i] = ARGV[1 + i]
  end
  for i = k + 2, #ARGV do
    args[i - k - 1] = ARGV[i]
  end
  KEYS, ARGV = keys, args
end
