-- lib_entries.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: a log's live entries read by number, from 0, the
-- oldest (lib_log.lua: the closed ones, elements behind the header, then the open chunk's),
-- and a closed entry's codec as an element of its own. lib_log.lua's read_entry decodes the
-- open chunk's.

-- open_entries decodes the open chunk once per call: times, costs, byte positions, and the
-- spans of refunded runs (by entry number; absent: one seq).
function g.open_entries(log)
  if log.open_ts == nil then
    local ts, cs, ps, ss, pos, s = {}, {}, {}, {}, 1, log.open
    while pos <= #s do
      local k = #ts + 1
      ps[k] = pos
      ts[k], cs[k], pos, ss[k] = read_entry(s, pos)
    end
    ps[#ps + 1] = pos
    log.open_ts, log.open_cs, log.open_ps, log.open_ss = ts, cs, ps, ss
  end
  return log.open_ts, log.open_cs, log.open_ps, log.open_ss
end

-- set_open replaces the open chunk, forgetting its decoded form.
function g.set_open(log, s)
  log.open, log.open_ts, log.open_cs, log.open_ps = s, nil, nil, nil
end

-- entries returns the times, costs and spans (by position; absent: one seq) of live entries
-- [from, to] (clamped to the last).
function g.entries(log, from, to)
  if to >= log.count then
    to = log.count - 1
  end
  local ts, cs, ss = {}, {}, {}
  if from < log.closed then
    local last = to
    if last >= log.closed then
      last = log.closed - 1
    end
    local skip = 1 + log.gone
    local es = redis.call('LRANGE', log.key, from + skip, last + skip)
    if #es ~= last - from + 1 then
      g.refuse_elements(log.key, 'fewer entries than the header counts')
    end
    for i = 1, #es do
      ts[i], cs[i], ss[i] = g.read_element(log.key, es[i])
    end
  end
  if to >= log.closed then
    local ots, ocs, _, oss = g.open_entries(log)
    local first = from
    if first < log.closed then
      first = log.closed
    end
    for i = first, to do
      local k = #ts + 1
      ts[k], cs[k], ss[k] = ots[i - log.closed + 1], ocs[i - log.closed + 1], oss[i - log.closed + 1]
    end
  end
  return ts, cs, ss
end

-- entry_at returns the time, cost and span (nil: one seq) of live entry i.
function g.entry_at(log, i)
  local ts, cs, ss = g.entries(log, i, i)
  return ts[1], cs[1], ss[1]
end

-- seek returns the first live entry from entry from on whose time is after bound (log.count
-- when none is), and its time: entries are in time order, so it gallops from from (entries
-- from, from + 1, from + 3, from + 7, ...) then bisects, reading O(log j) entries for j that lie
-- at or before bound, however many they are. A decision after an idle stretch, a read-only one
-- included, finds where a window starts so, instead of reading every entry that left it.
function g.seek(log, from, bound)
  local lo, hi, hi_t, step = from, log.count, nil, 1
  while lo + step - 1 < hi do
    local i = lo + step - 1
    local t = g.entry_at(log, i)
    if t > bound then
      hi, hi_t = i, t
      break
    end
    lo, step = i + 1, step * 2
  end
  while lo < hi do
    local mid = lo + (hi - lo - (hi - lo) % 2) / 2
    local t = g.entry_at(log, mid)
    if t > bound then
      hi, hi_t = mid, t
    else
      lo = mid + 1
    end
  end
  return lo, hi_t
end

-- unit_after reports whether every live entry after bound costs 1: none is after
-- last_weighted (lib_log.lua). Then the events after bound are counted by number.
function g.unit_after(log, bound)
  return log.last_weighted <= bound
end

-- open_total is the cost of the open chunk's entries.
function g.open_total(log)
  local _, cs = g.open_entries(log)
  local sum = 0
  for i = 1, #cs do
    sum = sum + cs[i]
  end
  return sum
end

-- oldest_time is the time of the oldest live entry, or 2^54 when there is none.
function g.oldest_time(log)
  if log.count == 0 then
    return NO_TIME_AFTER
  elseif log.closed > 0 then
    return log.oldest
  end
  return (read_entry(log.open, 1))
end

-- make_element encodes an entry as an element of its own (a closed entry): as in the open
-- chunk, but a cost-1 entry is its 7 bytes of time alone, since the element's length tells.
-- A refunded run of more than one seq (span) is make_run's.
function g.make_element(t, cost, span)
  if cost == 1 then
    return struct.pack('>i7', t)
  elseif cost == 0 and span ~= nil then
    return make_run(t, span)
  end
  return make_entry(t, cost)
end

-- read_element decodes a closed entry of key's log: its time, cost and span (nil: one seq). An
-- element of no entry's length (7, 8, 10 or 12 bytes, as its cost byte says) is refused: the
-- list is not a log.
function g.read_element(key, e)
  if #e == 7 then
    return (struct.unpack('>i7', e)), 1
  end
  local b = string.byte(e, 8)
  if not (#e == 8 and b ~= nil and b < 254 or #e == 10 and b == 254 or #e == 12 and b == 255) then
    g.refuse_elements(key, 'an element is no entry')
  end
  local t, cost, _, span = read_entry(e, 1)
  return t, cost, span
end
