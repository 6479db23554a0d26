-- lib_general.lua: a part of the general path, included in general()'s body (lib_log.lua),
-- where g is the table of its functions: decide, the decision of every request that
-- decide_small and merge_small (lib_small.lua, lib_slot.lua) do not take: policies, calendar
-- limits, reservations, big logs, callers' clocks out of step, and peeks. lib_decide.lua and
-- lib_peek.lua call it; it uses every other part of the general path. And view, which reads
-- a request's flat limits once.

-- decide judges a request of n events at now against limits (decide.lua documents them: the
-- sliding limits' (window, max) pairs, windows ascending, with the resolution and the
-- calendar limits, as g.view reads them), and records it when every limit has room. write
-- false only judges (a peek): nothing moves, and the longest window skips the entries that
-- have left it instead of trimming them. It returns the least room left (after recording),
-- the 1-based position of the limit it belongs to (the shortest window among equals; the
-- calendar limits follow the sliding ones), the wait until every limit has room for n (0:
-- admitted), the events in the longest window before recording, the entry's seq (0 when
-- the request records no entry: calendar limits alone), and quota_after: the wait until
-- the first event in that limit's window (after recording) leaves it, or its period ends,
-- 0 when the window holds none.
--
-- With a resolution, the entry is recorded at the end of its slot, now rounded up to a
-- multiple of res, and joins the entry of that slot (g.merge_slot) when there is one: it counts at
-- least as long as the request would, so no window ever admits more than its max, and at
-- most res longer. A reservation (a hold, the engine's local quota) is recorded at now +
-- hold (then rounded up to its slot): every admission made from it happens in [now, now +
-- hold], so its entry counts at least as long as each of them would, by the same argument.
-- Calendar limits count their period's counter (lib_log.lua).
--
-- A charge (limits carry -4: the engine's Charge) records its n events whatever the limits
-- say: events already used. When they fit, it is an admission. When they do not, the entry
-- goes in all the same, remaining is 0, and the wait returned is the one until a request of
-- one event has room again, the charge's events counted: the charge's own entry, when what
-- must leave is more than the window held before it.
function g.decide(log, now, n, limits, write)
  local sliding, res, cals, hold, charge = g.view(limits)
  local last = #sliding / 2
  local t = now + hold
  if res > 0 and t % res ~= 0 then
    t = t - t % res + res
  end
  local charge_wait, over = 0, false -- a charge's wait for one event, and whether it did not fit
  -- The log keeps every entry the longest window ever counted on the key still counts
  -- (its horizon), so that no limit on the key ever trims what another one counts.
  local reach = log.horizon
  if last > 0 and sliding[2 * last - 1] > reach then
    reach = sliding[2 * last - 1]
  end
  if write then
    g.trim(log, now - reach)
    if reach > log.horizon then
      log.horizon, log.dirty, log.horizon_grew = reach, true, true
    end
  end
  local remaining, tightest, retry_after, count = nil, 1, 0, 0
  local tfirst, tcount, twindow = 0, 0, 0 -- the tightest limit's first entry, events, window
  local tends = nil -- the tightest limit's period end, when it is a calendar limit
  for i = 1, last do
    local window, max = sliding[2 * i - 1], sliding[2 * i]
    local first = 0
    count = log.total
    if i < last or not write or window < reach then
      local c = g.cursor(log, window, now, write)
      count, first = log.total - c.partial, c.idx
    end
    if remaining == nil or max - count < remaining then
      remaining, tightest = max - count, i
      tfirst, tcount, twindow = first, count, window
    end
    if count + n > max and charge then
      over = true
    elseif count + n > max then
      local wait = g.covering(log, first, count + n - max, count) + window - now
      if wait > retry_after then
        retry_after = wait
      end
    end
    if charge and count + n + 1 > max then
      local k, wait = count + n + 1 - max, t + window - now
      if k <= count then
        wait = g.covering(log, first, k, count) + window - now
      end
      if wait > charge_wait then
        charge_wait = wait
      end
    end
  end
  local periods = {}
  for j = 1, #cals do
    local cal = cals[j]
    local start, stop = g.period(cal, now)
    periods[j] = {start, stop}
    local c, held = g.counter(log, start, stop), 0
    if c ~= nil then
      held = c.events
      c.used = true
    elseif g.ended(log, stop) then
      -- A caller's clock behind the others': its period ended on this key, and its count
      -- may be gone. Deny until it ends, as a sliding log denies early, never late.
      held = cal[1]
    end
    if remaining == nil or cal[1] - held < remaining then
      remaining, tightest, tcount, tends = cal[1] - held, last + j, held, stop
    end
    if held + n > cal[1] and charge then
      over = true
    elseif held + n > cal[1] and stop - now > retry_after then
      retry_after = stop - now
    end
    if charge and held + n + 1 > cal[1] and stop - now > charge_wait then
      charge_wait = stop - now
    end
  end
  -- The first event in the tightest window: from its first entry on, skipping refunded ones.
  local quota_after = 0
  if tends ~= nil then
    if tcount > 0 then
      quota_after = tends - now
    end
  elseif tcount > 0 then
    quota_after = g.covering(log, tfirst, 1, tcount) + twindow - now
  end
  if over then
    retry_after = charge_wait
  else
    over = retry_after > 0
  end
  if over and not charge or not write then
    if remaining < 0 then
      remaining = 0
    end
    return remaining, tightest, retry_after, count, 0, quota_after
  end
  -- The new entry is in the window too, and older than every entry a clock ahead recorded.
  if tends ~= nil then
    quota_after = tends - now
  elseif tcount == 0 or quota_after > twindow then
    quota_after = twindow
  end
  -- The counters: every period this request counts in gets one, and every counter whose
  -- period holds now counts the request, whatever limit made it.
  for j = 1, #periods do
    local start, stop = periods[j][1], periods[j][2]
    if g.counter(log, start, stop) == nil then
      g.drop_before(log, start)
      log.counters[#log.counters + 1] = {start = start, stop = stop, events = 0, used = true}
      log.dirty = true
    end
  end
  g.count_in(log, now, n)
  if log.exists then
    -- The expiry the key needs once the entry is in, set before it goes in: a server that
    -- refuses it refuses before anything is recorded.
    local until_us = g.reset_at(log, log.horizon)
    if last > 0 and math.max(log.newest, t) + log.horizon > until_us then
      until_us = math.max(log.newest, t) + log.horizon
    end
    keep_log_until(log.key, now, until_us, log.server_clock)
    log.expiry_set = true
  end
  local seq = 0
  if last > 0 then
    if res > 0 then
      seq = g.merge_slot(log, t, n)
    end
    if seq == nil or seq == 0 then
      seq = g.insert(log, t, n)
    end
  end
  remaining = remaining - n
  if remaining < 0 then
    remaining = 0
  end
  return remaining, tightest, retry_after, count, seq, quota_after
end

-- view splits a request's flat limits (decide.lua documents them) once: sliding, the
-- (window, max) pairs, windows ascending; res, the resolution entries are recorded at (0:
-- exact); cals, the calendar limits, each {max, b0, b1, b2, b3}; hold, how long after now
-- the entry is recorded (a reservation; 0 for an admission); charge, whether the request is
-- a charge (-4 and a 0), recorded whatever the limits say.
function g.view(limits)
  if limits.sliding == nil then
    local sliding, cals, res, hold, i = {}, {}, 0, 0, 1
    local charge = false
    while i <= #limits do
      local v = limits[i]
      if v == -4 then
        charge, i = true, i + 2
      elseif v == -1 then
        res, i = limits[i + 1], i + 2
      elseif v == -3 then
        hold, i = limits[i + 1], i + 2
      elseif v == -2 then
        cals[#cals + 1] = {limits[i + 1], limits[i + 2], limits[i + 3], limits[i + 4], limits[i + 5]}
        i = i + 6
      else
        sliding[#sliding + 1] = v
        sliding[#sliding + 1] = limits[i + 1]
        i = i + 2
      end
    end
    limits.sliding, limits.res, limits.cals, limits.hold = sliding, res, cals, hold
    limits.charge = charge
  end
  return limits.sliding, limits.res, limits.cals, limits.hold, limits.charge
end
