-- lib_log.lua: a part included by the scripts (not a script of its own): a key's log.
--
-- A key's log is one admitted request per entry, in time order (oldest first), each carrying
-- its time and its cost in events. It is stored as one Valkey list:
--
--   element 0        the header: the log's totals, its cursors, then the newest entries (the
--                    open chunk, up to 32 of them) as one string
--   elements 1..     the older entries, one element each: first "gone" entries that have left
--                    every window and wait to be dropped, then "closed" live ones; a closed
--                    cost-1 entry is its 7 bytes of time alone (9 bytes of listpack)
--
-- Most keys hold few live entries, so their whole log is the header: a decision reads one
-- element, rewrites it, and sets the expiry. When the open chunk is full, its entries move
-- behind the header in one RPUSH; entries that left the window there are dropped a few at a
-- time with one LTRIM. (A log that fits in its header could be a string key, written with
-- its expiry by one SET PX instead of LSET and PEXPIRE: measured, it cost the server as much.)
--
-- An entry is 7 bytes of time (microseconds since the Unix epoch, big-endian two's
-- complement), then its cost: one byte below 254; 254 and 2 bytes; 255 and 4 bytes (all
-- big-endian). A cost-1 entry is 8 bytes in the open chunk, 7 as an element. An entry's
-- identity is its time and its position among the entries of that microsecond (seq, from 1).
-- The first byte of a time between the years 1827 and 2112 is 0x00-0x0F or 0xF0-0xFF, so no
-- entry or header reads as a decimal integer: the list keeps them as strings.
--
-- Slots: a limit with a resolution records a request at the end of its slot (its time rounded
-- up to a multiple of the resolution), and adds its cost to the entry of that time that
-- carries events, when one is among the newest few (g.merge_slot, lib_insert.lua): the entry is
-- then shared by the slot's requests, and a settle of one of them (settle.lua, shared) takes
-- its cost off the slot's entry.
--
-- Refunds: a settle lowers the cost in place. An entry refunded in full joins the refunded
-- entries of its microsecond beside it into one refunded run, which stands for all their seqs
-- (span), written in the encodings make_entry never uses: 254 then a span below 254, 255 then
-- a span below 65536 (a span of one is a plain cost-0 entry). A run leaves the log once it is
-- the last entry of its microsecond (no later seq counts on it) and older than the newest (no
-- append can take its seqs); one left at the end goes with the next append of a later
-- microsecond. So refunded entries never outnumber live ones plus one, and no identity of
-- another entry moves.
--
-- The header opens with its kind, one byte, which says the layout's version and the header's
-- shape. This release writes and reads one layout, LAYOUT, of five kinds:
--
--   'V'  small: six fields (total, count, newest, seq, horizon, expires), then the open chunk
--   'U'  the same, when the last entry is a refunded run
--   'K'  full: eleven fields (the small ones but expires, then gone, closed, oldest,
--        oldest_cost, cursors, last_weighted), one byte, cached, then the cursors, the head
--        cache and the open chunk
--   'L'  the same, when the last entry is a refunded run
--   'C'  a prefix for calendar counters, before one of the four: 'C', a byte k (1 to
--        MAX_COUNTERS), then k counters of three fields (start, end: the period, in
--        microseconds, start <= t < end; events: the events admitted on the key in that
--        period since the counter was made)
--
-- A key whose value is anything else (another type; a list whose first element is no header
-- of these kinds: an earlier pre-release layout's, a later release's, or another program's) is
-- refused with an error reply BADLAYOUT that says what was found; it is never read as a log,
-- never converted, and nothing is written to it. A header is known by more than its kind
-- byte: its fields in the ranges a log's take (MAX_TIME and the bounds below), its open chunk
-- exactly the entries it counts, and the list exactly the elements it counts behind it
-- (lib_header.lua's read_log); the fast paths take only headers whose fields and length
-- agree, and leave every other one to the general path.
--
-- Calendar counters: every admission on the key adds its cost to every counter whose period
-- holds its time, so a counter counts the key's events whatever limit admitted them, from its
-- first use on; a refund takes its give-back from the counters whose period holds the
-- request's decision time. A counter whose period ended is dropped when a later period's
-- counter is made; a request of a period that ended on the key (a later counter exists: a
-- caller's clock behind) is denied until that period's end.
--
-- The head cache holds copies of the oldest closed entries (up to HEAD_CACHE, oldest first, 8
-- bytes each as in the open chunk), so that the busy path (lib_busy.lua) trims with no read
-- but one LRANGE per HEAD_CACHE entries; the general path ignores it and writes it empty.
-- last_weighted is a time at or after the newest live entry whose cost is not 1
-- (NO_TIME_BEFORE when none ever was). So a log whose oldest live entry is after
-- last_weighted holds only entries of cost 1 (a unit log), and the entry at which a window's
-- events reach any count is found by its number alone, with one read (lib_cover.lua,
-- lib_busy.lua): a denial costs the same at any depth. Every write that makes an entry's cost
-- other than 1 (an admission of cost n > 1, a slot's merge, a refund) moves last_weighted up
-- to that entry's time; nothing moves it down, so the claim is always true, and a log becomes
-- a unit log again once its last weighted entry has left every window. A small header, whose
-- entries are all read, takes the newest entry's of cost other than 1.
--
-- expires (small headers) is a time, in the server's milliseconds, at or before which the
-- key's expiry lies, or 0 for no claim: whoever writes a nonzero expires has set the key to
-- expire then or later, and a write that sets the expiry without knowing it writes 0. So a
-- decision whose entry needs the key until no later than expires sets no expiry at all; one
-- that needs it longer sets it with slack (lib_small.lua), and most decisions of a small key
-- make three server calls, not four.
--
-- The fields, 7 bytes big-endian each: total (the live entries' cost), count (live entries),
-- newest (the newest entry's time), seq (its position in its microsecond), horizon (the
-- longest window ever counted on the key: the log keeps what it counts, and the key's expiry
-- follows it, so no limit on the key trims what another one counts); and, full only: gone,
-- closed (see above), oldest and oldest_cost (the oldest closed entry's time and cost, when
-- closed > 0), cursors (how many follow). A cursor, five fields, is kept per
-- shorter window counted on this key: window, idx (the live entries at or before the window's
-- start are entries [0, idx)), partial (their cost), before and after (the times of entries
-- idx-1 and idx; -2^54 and 2^54 where there is none). A cursor moves only as far as the clock
-- did, so counting a shorter window costs amortized O(1), like trimming the horizon.
--
-- Counting: the events in a window at now are the cost of the entries with a time after
-- now - window, later than now included (callers' clocks may disagree: that can deny early,
-- never admit too many). Live entries are numbered from 0: the closed ones, then the open
-- chunk's.
--
-- Speed: EVALSHA makes every function of a script anew on each call, and a function costs
-- more to make the more of the script's locals it captures; every redis.call, every element
-- of its reply and every table cost more than most Lua. So the common decision (one limit, a
-- small log) is decide_small (lib_small.lua), which works on the header string and locals alone;
-- everything else goes through general(), whose functions are made only by the calls that need them.
-- The layout's constants are named by the --const lines below: the composer (scripts.go)
-- writes each one's value in its place in the code, so a constant costs a call nothing (as a
-- local it would be an upvalue of every function that uses it: measured on callgrind, 6 %
-- more instructions per common decision).
--
-- The code: this file holds what each call of a script that reads a log makes (the entry
-- codec, keep_log_until, read_header) and general(), the general path: a table g of
-- functions, made on the first call that needs it by the parts its body includes, one
-- concept each (they call one another through g, when they run, so their order is the
-- order to read them in):
--
--   lib_header.lua    the header read into a log (a table) and written back
--   lib_counters.lua  the calendar counters
--   lib_entries.lua   the live entries, read by number
--   lib_cursor.lua    a window's cursor: where the window starts among the entries
--   lib_cover.lua     covering: when enough of a window's events will have left it
--   lib_trim.lua      trim: the entries that left every window go
--   lib_insert.lua    insert and merge_slot: an entry comes in; set_cost and remove
--   lib_general.lua   decide: the general decision, over all of the above
--
-- settle.lua adds lib_refund.lua's functions to g (find, compact): only a settle needs them.
--
-- LAYOUT is the layout version this release writes and reads (inspect.lua reports it).
--const LAYOUT 5
-- The header kinds (see above), as bytes.
--const KIND_V 86
--const KIND_U 85
--const KIND_K 75
--const KIND_L 76
--const KIND_C 67
-- HEAD_CACHE is the most entries a full header's head cache holds.
--const HEAD_CACHE 8
-- MAX_COUNTERS is the most calendar counters a log keeps: the periods live at once on a key
-- (a policy's day, week, month and year, say), as many as a policy's limits.
--const MAX_COUNTERS 16
-- OPEN_CHUNK_MAX is the most entries the header's open chunk holds.
--const OPEN_CHUNK_MAX 32
-- COVER_WALK is the most entries a decision reads from each end of a window to find when a
-- denied request would be admitted (g.covering, lib_cover.lua).
--const COVER_WALK 32
-- MAX_CURSORS is the most windows a policy counts at once: the engine's MaxPolicyLimits, which
-- a test ties to this value. A log keeps at least that many cursors.
--const MAX_CURSORS 16
-- MAX_TIME bounds every time a log holds: the years 1827 to 2112 are within +-2^52
-- microseconds (the engine refuses a caller's time outside them; a slot's end or a hold lies
-- a window at most beyond one). MAX_WINDOW is the longest window (the engine's MaxWindow,
-- 2^50 microseconds); MAX_COUNT bounds a log's events, entries and seqs (an entry costs at most
-- 2^31 - 1, and a window holds at most 2^31 - 1 events' worth of admitted entries, plus
-- refunded runs and charges); MAX_STORED_CURSORS bounds a header's cursors (save keeps at
-- most MAX_CURSORS once more were counted). They tell a header from text: no 7 bytes of
-- text (each 0x20 or above) decode to a time, a count or a window in these ranges.
--const MAX_TIME (2 ^ 52 + 2 ^ 51)
--const MAX_WINDOW (2 ^ 50)
--const MAX_COUNT (2 ^ 48)
--const MAX_STORED_CURSORS 64
-- NO_TIME_BEFORE and NO_TIME_AFTER stand for "no entry" on either side of a cursor: below and
-- above every time a log holds (the years 1827 to 2112 are within +-2^52 microseconds).
--const NO_TIME_BEFORE (-2 ^ 54)
--const NO_TIME_AFTER (2 ^ 54)

-- make_entry encodes an entry.
local function make_entry(t, cost)
  if cost < 254 then
    return struct.pack('>i7B', t, cost)
  elseif cost < 65536 then
    return struct.pack('>i7BI2', t, 254, cost)
  end
  return struct.pack('>i7BI4', t, 255, cost)
end

-- read_entry decodes the entry at byte pos of s: its time, its cost, the position after it,
-- and, for a refunded run (see the header comment), how many seqs it stands for (nil: one).
local function read_entry(s, pos)
  local t = struct.unpack('>i7', s, pos)
  local b = string.byte(s, pos + 7)
  if b < 254 then
    return t, b, pos + 8
  end
  -- 254: the value in 2 bytes; 255: in 4. Below the least cost make_entry writes that way, the
  -- value is a refunded run's span.
  local format, size, least = '>I2', 2, 254
  if b == 255 then
    format, size, least = '>I4', 4, 65536
  end
  local v = struct.unpack(format, s, pos + 8)
  if v < least then
    return t, 0, pos + 8 + size, v
  end
  return t, v, pos + 8 + size
end

-- make_run encodes a refunded run: span refunded entries of one microsecond (1 to 65535), as
-- one entry of cost 0. One is a plain entry of cost 0; more use the cost encodings that
-- make_entry never writes (254 then a value below 254; 255 then a value below 65536).
local function make_run(t, span)
  if span == 1 then
    return make_entry(t, 0)
  elseif span < 254 then
    return struct.pack('>i7BI2', t, 254, span)
  end
  return struct.pack('>i7BI4', t, 255, span)
end

-- keep_log_until makes key last at least until until_us, its newest entry's time plus the key's
-- horizon: on the server's clock (server_clock) by PEXPIREAT at that time in milliseconds,
-- rounded up, so that the key goes within a millisecond after its last entry leaves every
-- window; on a caller's clock by PEXPIRE, relative to now, as the caller's clock may be far
-- from the server's, with RELATIVE_EXPIRY_SLACK_MS more: the server counts a relative expiry
-- from its time at the call's start, in whole milliseconds, which may lie up to one
-- millisecond (and one more across a boundary) before now.
--const RELATIVE_EXPIRY_SLACK_MS 2
local function keep_log_until(key, now, until_us, server_clock)
  if server_clock then
    redis.call('PEXPIREAT', key, math.ceil(until_us / 1000))
  else
    redis.call('PEXPIRE', key, math.ceil((until_us - now) / 1000) + RELATIVE_EXPIRY_SLACK_MS)
  end
end

-- read_header reads key's header: the string, false when the key does not exist, or the
-- server's error as a table (the key holds something else).
local function read_header(key)
  return redis.pcall('LINDEX', key, 0)
end

-- general returns the functions of the general path: the log as a table, for policies,
-- peeks, settles, big logs and callers' clocks out of step. They are made on the first call
-- that needs them (see Speed and The code, above).
local general_functions
local function general()
  if general_functions ~= nil then
    return general_functions
  end
  local g = {}
  general_functions = g
-- include: lib_header.lua
-- include: lib_counters.lua
-- include: lib_entries.lua
-- include: lib_cursor.lua
-- include: lib_cover.lua
-- include: lib_trim.lua
-- include: lib_insert.lua
-- include: lib_general.lua
  return g
end
