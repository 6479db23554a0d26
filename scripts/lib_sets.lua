-- lib_sets.lua: a part included by the batch scripts (not a script of its own), after
-- lib_keys.lua, whose ARGV it reads: the limit sets of a batch call, which its requests name
-- by number so that a limit shared by many requests is sent once.
--
-- read_sets reads the sets that start at ARGV[at]: their number S, then per set its number of
-- values L and its L values, decide.lua's limits in decimal (as its decimal ARGV[3..]). It
-- returns the sets, in order, and the index of the argument after the last one.
local function read_sets(at)
  local sets, a = {}, at + 1
  for s = 1, tonumber(ARGV[at]) do
    local count, limits = tonumber(ARGV[a]), {}
    for j = 1, count do
      limits[j] = tonumber(ARGV[a + j])
    end
    sets[s] = limits
    a = a + 1 + count
  end
  return sets, a
end
