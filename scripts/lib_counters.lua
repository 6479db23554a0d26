-- lib_counters.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: the calendar counters of a log (lib_log.lua),
-- log.counters, a list of {start, stop, events}, used when this call counted on it;
-- lib_header.lua reads and writes them. Here: find a period's counter, drop the ended ones,
-- count events in, pick the period that holds now, and when the log holds no event any more.

-- counter returns log's counter of the period [start, stop), or nil.
function g.counter(log, start, stop)
  local counters = log.counters
  for i = 1, #counters do
    local c = counters[i]
    if c.start == start and c.stop == stop then
      return c
    end
  end
  return nil
end

-- drop_before forgets the counters whose period ended at or before start, a new counter's:
-- a period ends on a key when a later one starts counting on it.
function g.drop_before(log, start)
  local counters, kept = log.counters, {}
  for i = 1, #counters do
    if counters[i].stop > start then
      kept[#kept + 1] = counters[i]
    end
  end
  if #kept ~= #counters then
    log.counters, log.dirty = kept, true
  end
end

-- ended reports whether a period that ends at stop is over on log: a counter of a later
-- period exists (so its own counter, if it had one, may be gone).
function g.ended(log, stop)
  local counters = log.counters
  for i = 1, #counters do
    if counters[i].start >= stop then
      return true
    end
  end
  return false
end

-- count_in adds events (negative: takes them back, never below 0) to every counter whose
-- period holds t, and returns how many it changed.
function g.count_in(log, t, events)
  local changed, counters = 0, log.counters
  for i = 1, #counters do
    local c = counters[i]
    if c.start <= t and t < c.stop then
      local v = c.events + events
      if v < 0 then
        v = 0
      end
      if v ~= c.events then
        c.events, changed, log.dirty = v, changed + 1, true
      end
    end
  end
  return changed
end

-- period picks, from a calendar limit's boundaries b0 < b1 < b2 < b3 (the engine computes
-- them around its own clock: the period before, the current one, the next), the period
-- that holds now: its start and end. A now outside them all is a clock too far from the
-- engine's, refused with BADCLOCK.
function g.period(cal, now)
  for i = 2, 4 do
    if cal[i] <= now and now < cal[i + 1] then
      return cal[i], cal[i + 1]
    end
  end
  error({err = string.format('BADCLOCK the time %d is outside the calendar periods %d to %d the engine sent: '
    .. 'its clock and the server\'s differ by more than a period', now, cal[2], cal[5])})
end

-- reset_at is when log holds no event any more: its newest entry plus reach (its horizon),
-- or the end of the latest period a counter holds events in; NO_TIME_BEFORE when empty.
function g.reset_at(log, reach)
  local at = NO_TIME_BEFORE
  if log.count > 0 then
    at = log.newest + reach
  end
  local counters = log.counters
  for i = 1, #counters do
    local c = counters[i]
    if c.events > 0 and c.stop > at then
      at = c.stop
    end
  end
  return at
end
