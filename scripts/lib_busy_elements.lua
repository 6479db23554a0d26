-- lib_busy_elements.lua: a part included right before lib_busy.lua (not a script of its own):
-- the closed entries of a busy key's log as the busy path reads them, elements of their own
-- behind the header (lib_log.lua): one decoded (busy_element), and the first after a time
-- found without reading those before it (busy_seek). Like lib_busy.lua, it uses no other
-- function of the scripts, so that the common decision, taken before, makes none of these.

-- busy_element decodes a closed entry, an element of its own (lib_entries.lua's
-- read_element): its time and its cost, 0 for a refunded run.
local function busy_element(e)
  if type(e) ~= 'string' then
    error({err = 'BADLAYOUT the key holds a list whose elements do not agree with its header (fewer entries than the header counts), not a strictrate log'})
  elseif #e == 7 then
    return (struct.unpack('>i7', e)), 1
  end
  local b = string.byte(e, 8)
  if not (#e == 8 and b ~= nil and b < 254 or #e == 10 and b == 254 or #e == 12 and b == 255) then
    error({err = 'BADLAYOUT the key holds a list whose elements do not agree with its header (an element is no entry), not a strictrate log'})
  end
  local t = struct.unpack('>i7', e)
  if #e == 8 then
    return t, b
  elseif b == 254 then
    local v = struct.unpack('>I2', e, 9)
    if v < 254 then
      return t, 0
    end
    return t, v
  end
  local v = struct.unpack('>I4', e, 9)
  if v < 65536 then
    return t, 0
  end
  return t, v
end

-- busy_seek finds, among the closed entries of key (elements gone + 1 to gone + closed, in
-- time order, each after after, the time of an entry known to lie at or before cutoff, and
-- before newest), how many lie at or before cutoff. It guesses where cutoff falls as if the
-- entries were spread evenly in time, reads the entry there, gallops from it (1, 2, 4, 8, ...
-- elements on, or back) to the first read on the far side of cutoff, then bisects: a few
-- LINDEXes when traffic is steady, O(log n) however it came. It returns that count and the
-- time of the first closed entry after cutoff (nil when none is).
local function busy_seek(key, gone, closed, cutoff, after, newest)
  local function time_of(i)
    return (busy_element(redis.call('LINDEX', key, gone + 1 + i)))
  end
  -- Entries [0, lo) lie at or before cutoff; [hi, closed) after it, the first at hi_t.
  local lo, hi, hi_t = 0, closed, nil
  local guess = closed - 1
  if newest > after then
    guess = math.floor(closed * (cutoff - after) / (newest - after))
    if guess > closed - 1 then
      guess = closed - 1
    end
  end
  local t, step = time_of(guess), 1
  if t <= cutoff then
    lo = guess + 1
    while lo + step - 1 < hi do
      local i = lo + step - 1
      t = time_of(i)
      if t > cutoff then
        hi, hi_t = i, t
        break
      end
      lo, step = i + 1, step * 2
    end
  else
    hi, hi_t = guess, t
    while hi - step >= lo do
      local i = hi - step
      t = time_of(i)
      if t <= cutoff then
        lo = i + 1
        break
      end
      hi, hi_t, step = i, t, step * 2
    end
  end
  while lo < hi do
    local mid = lo + (hi - lo - (hi - lo) % 2) / 2
    t = time_of(mid)
    if t > cutoff then
      hi, hi_t = mid, t
    else
      lo = mid + 1
    end
  end
  return lo, hi_t
end
