-- lib_refund.lua: a part included by settle.lua alone, right after its g = general()
-- (lib_log.lua): it adds to g what a refund needs beside the general path's functions: find,
-- an entry by its identity, and compact, which keeps refunded entries from piling up
-- (lib_log.lua, Refunds). No other script reaches them, so no other script makes them.

-- find returns the live index of the entry with time t and position seq among the entries
-- of that microsecond, or nil when the log holds none.
function g.find(log, t, seq)
  if log.count == 0 or t > log.newest or t < g.oldest_time(log) then
    return nil
  end
  -- The first entry at or after t: most lookups are of recent entries, in the open chunk.
  local lo, hi = 0, log.count - 1
  if log.count > log.closed and g.entry_at(log, log.closed) < t then
    lo = log.closed
  end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if g.entry_at(log, mid) < t then
      lo = mid + 1
    else
      hi = mid
    end
  end
  -- The entries of that microsecond in order, a refunded run standing for its span of seqs.
  local below = 0
  for at = lo, log.count - 1 do
    local et, _, span = g.entry_at(log, at)
    if et ~= t then
      return nil
    end
    below = below + (span or 1)
    if seq <= below then
      return at
    end
  end
  return nil
end

-- compact keeps refunded entries from piling up, after live entry i was refunded in full: it
-- joins it with the refunded entries of its microsecond beside it into one run, and takes
-- the run out when no later entry's seq counts on it (it is the last of its microsecond) and
-- no append can take its seqs (the header's newest and seq stand for the newest microsecond).
-- So refunded entries never outnumber the entries that carry events, plus one, however many
-- requests were refunded, and the identities (time, seq) of the others do not move.
function g.compact(log, i)
  local t, _, span = g.entry_at(log, i)
  span = span or 1
  if i + 1 < log.count then
    local nt, nc, ns = g.entry_at(log, i + 1)
    if nt == t and nc == 0 and span + (ns or 1) <= 65535 then
      span = span + (ns or 1)
      g.remove(log, i + 1)
      g.set_cost(log, i, 0, span)
    end
  end
  if i > 0 then
    local pt, pc, ps = g.entry_at(log, i - 1)
    if pt == t and pc == 0 and span + (ps or 1) <= 65535 then
      span = span + (ps or 1)
      g.remove(log, i)
      i = i - 1
      g.set_cost(log, i, 0, span)
    end
  end
  if t < log.newest and (i + 1 >= log.count or g.entry_at(log, i + 1) > t) then
    g.remove(log, i)
  end
  -- A refunded run left at the end is of the newest microsecond: the next append of a later
  -- one takes it out (insert), and the header says so, so that it need not be read to know.
  log.tail_refunded = false
  if log.count > 0 then
    local _, last_cost = g.entry_at(log, log.count - 1)
    log.tail_refunded = last_cost == 0
  end
  log.dirty = true
end
