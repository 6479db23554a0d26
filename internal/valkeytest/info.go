package valkeytest

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// Info is an INFO or CLUSTER INFO reply parsed into its fields: Info["role"] is "master" or
// "slave" for INFO replication, Info["cluster_state"] is "ok" for a healthy cluster. An absent
// field reads as "".
type Info map[string]string

// ParseInfo parses the text of an INFO or CLUSTER INFO reply: one "name:value" field a line
// (CRLF or LF); section headers ("# Server") and blank lines are skipped. Under RESP3 the reply
// is a verbatim string, which valkey-go hands over with its format prefix "txt:"; that prefix is
// dropped.
func ParseInfo(text string) Info {
	info := Info{}
	for _, line := range strings.Split(strings.TrimPrefix(text, "txt:"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if name, value, ok := strings.Cut(line, ":"); ok {
			info[name] = value
		}
	}
	return info
}

// ReadInfo sends INFO section (e.g. "replication", "commandstats") to c and parses the reply.
func ReadInfo(ctx context.Context, c valkey.Client, section string) (Info, error) {
	text, err := c.Do(ctx, c.B().Info().Section(section).Build()).ToString()
	if err != nil {
		return nil, err
	}
	return ParseInfo(text), nil
}

// CommandStat is one command's line of INFO commandstats.
type CommandStat struct {
	// Calls is how many times the command ran since the last CONFIG RESETSTAT.
	Calls int64
	// Usec is the server time those calls took, in microseconds.
	Usec float64
	// RejectedCalls is how many times the server refused the command before running it (a
	// redirection such as MOVED or ASK, a wrong arity, OOM): not counted in Calls.
	RejectedCalls int64
}

// CommandStats reads the fields of an INFO commandstats reply, such as
// "cmdstat_evalsha:calls=10,usec=150,...", by command name: CommandStats()["evalsha"]. A
// command that never ran since the last CONFIG RESETSTAT is absent.
func (i Info) CommandStats() map[string]CommandStat {
	stats := map[string]CommandStat{}
	for name, value := range i {
		command, ok := strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		var st CommandStat
		for _, pair := range strings.Split(value, ",") {
			k, v, _ := strings.Cut(pair, "=")
			switch k {
			case "calls":
				st.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.Usec, _ = strconv.ParseFloat(v, 64)
			case "rejected_calls":
				st.RejectedCalls, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		stats[command] = st
	}
	return stats
}

// CPUSeconds is the server process's CPU time from the fields of an INFO cpu reply:
// used_cpu_sys plus used_cpu_user, in seconds. It fails when either field is absent or not a
// number.
func (i Info) CPUSeconds() (float64, error) {
	var total float64
	for _, field := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, err := strconv.ParseFloat(i[field], 64)
		if err != nil {
			return 0, fmt.Errorf("valkeytest: INFO cpu %s=%q: %w", field, i[field], err)
		}
		total += v
	}
	return total, nil
}

// ServerVersion names the server c reaches and its version, "Valkey 8.0.1" or "Redis 7.2.4",
// from INFO server; "unknown" when that cannot be told.
func ServerVersion(ctx context.Context, c valkey.Client) string {
	info, err := ReadInfo(ctx, c, "server")
	if err != nil {
		return "unknown"
	}
	if v := info["valkey_version"]; v != "" {
		return "Valkey " + v
	}
	if v := info["redis_version"]; v != "" {
		return "Redis " + v
	}
	return "unknown"
}
