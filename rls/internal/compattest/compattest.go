// Package compattest writes the rate limit service's answers as the tests that port the
// reference server's cases (envoyproxy/ratelimit) write them, so that a case reads as the
// reference's test asserts it: "OVER_LIMIT: OVER_LIMIT 5/MINUTE rem=0 reset; OK 3/MINUTE rem=0".
package compattest

import (
	"fmt"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Answer is a response as the cases write it: the overall code, then each descriptor's code,
// its limit (with its name when it has one), its limit_remaining, and "reset" when it carries
// a duration_until_reset. A descriptor without a limit is its code and remaining alone.
// Durations, which differ by design (a sliding window's exact time against a fixed window's
// end), are left out; a case that is about them checks them apart.
func Answer(resp *pb.RateLimitResponse) string {
	parts := make([]string, len(resp.GetStatuses()))
	for i, st := range resp.GetStatuses() {
		var b strings.Builder
		b.WriteString(st.GetCode().String())
		if l := st.GetCurrentLimit(); l != nil {
			fmt.Fprintf(&b, " %d/%s", l.GetRequestsPerUnit(), l.GetUnit())
			if l.GetName() != "" {
				fmt.Fprintf(&b, " name=%s", l.GetName())
			}
		}
		fmt.Fprintf(&b, " rem=%d", st.GetLimitRemaining())
		if st.GetDurationUntilReset() != nil {
			b.WriteString(" reset")
		}
		parts[i] = b.String()
	}
	return resp.GetOverallCode().String() + ": " + strings.Join(parts, "; ")
}
