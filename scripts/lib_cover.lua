-- lib_cover.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: covering, the time at which enough of a window's
-- events will have left it, for a denied request's wait and for the time its limit next
-- gets quota back, read from at most COVER_WALK entries at each end of the window.

-- covering returns when need of the held events of a window (its live entries, from entry
-- from on) have left it: the time of the entry at which the entries' cost, oldest first,
-- reaches need. On a unit log it reads that entry alone. Else it reads at most COVER_WALK
-- entries from each end of the window, the end where that entry most likely lies first, so
-- that no request buys server time with its cost, or with how far a lowered limit leaves the
-- log over it: the entry is among the
-- oldest when few events must leave (a request of cost 1), among the newest when most must
-- (a cost near max). When it lies deeper in a long log, covering returns the time of the last
-- entry read from the front: the entry lies after it, so the request is not admitted before
-- that one leaves (a wait that never overstates, which the engine's deny cache relies on).
function g.covering(log, from, need, held)
  if from == 0 and log.closed > 0 and log.oldest_cost >= need then
    return log.oldest
  end
  if log.last_weighted < g.oldest_time(log) or from < log.count and log.last_weighted < g.entry_at(log, from) then
    -- A unit log (lib_log.lua), or one whose entries from the window's first on
    -- are all after last_weighted: every entry there is one event, so the entry sought is the
    -- need-th from the window's first, exactly, read alone.
    return (g.entry_at(log, from + need - 1))
  end
  local front_end = from + COVER_WALK
  if front_end > log.count then
    front_end = log.count
  end
  local back_start = log.count - COVER_WALK
  if back_start < front_end then
    back_start = front_end
  end
  local newest_first = need + need > held
  if newest_first then
    local t = g.cover_back(log, back_start, need, held)
    if t ~= nil then
      return t
    end
  end
  local t, last = g.cover_front(log, from, front_end, need)
  if t ~= nil then
    return t
  elseif front_end == log.count then
    g.refuse_elements(log.key, 'fewer events than the header counts')
  end
  if not newest_first then
    t = g.cover_back(log, back_start, need, held)
    if t ~= nil then
      return t
    end
  end
  return last
end

-- cover_front is covering's walk from the oldest entry of the window (from) up to entry
-- stop, excluded: the time of the entry at which the cost reaches need, or nil and the time
-- of the last entry read.
function g.cover_front(log, from, stop, need)
  local sum, i, chunk, last = 0, from, 4, nil
  while i < stop do
    local to = i + chunk - 1
    if to >= stop then
      to = stop - 1
    end
    local ts, cs = g.entries(log, i, to)
    for j = 1, #ts do
      sum = sum + cs[j]
      if sum >= need then
        return ts[j]
      end
      last = ts[j]
    end
    i = i + #ts
    chunk = chunk * 4
  end
  return nil, last
end

-- cover_back is covering's walk from the newest entry back to entry lowest: the entry it
-- seeks is the first, going back, after which at most held - need events stay in the
-- window; nil when none of these is.
function g.cover_back(log, lowest, need, held)
  local after, hi, chunk = 0, log.count - 1, 4
  while hi >= lowest do
    local lo = hi - chunk + 1
    if lo < lowest then
      lo = lowest
    end
    local ts, cs = g.entries(log, lo, hi)
    for j = #ts, 1, -1 do
      after = after + cs[j]
      if after > held - need then
        return ts[j]
      end
    end
    hi = lo - 1
    chunk = chunk * 4
  end
  return nil
end
