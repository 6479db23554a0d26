package config

import (
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// FromProto builds a Config from xDS RateLimitConfig resources (as Envoy Gateway sends them),
// checked as files are, each resource named by its name in messages. The resources carry no
// value_to_metric or share_threshold, which stay off, no unit_multiplier (a window of one
// unit) and no record_over_limit (rls.WithRecordOverLimit names such rules by their stats
// names); quota_mode and metadata are read as the
// reference's newer versions read them. A unit is read by its number, so week, month and
// year are accepted whether or not the sender's proto names them.
func FromProto(cfgs []*rlsconfv3.RateLimitConfig, opts ...Option) (*Config, error) {
	roots := make([]namedRoot, 0, len(cfgs))
	for _, c := range cfgs {
		if c == nil {
			continue
		}
		roots = append(roots, namedRoot{c.GetName(), &rawRoot{
			domain:      c.GetDomain(),
			descriptors: descriptorsFromProto(c.GetDescriptors()),
		}})
	}
	return build(roots, opts)
}

func descriptorsFromProto(ds []*rlsconfv3.RateLimitDescriptor) []rawDescriptor {
	out := make([]rawDescriptor, 0, len(ds))
	for _, d := range ds {
		if d == nil {
			continue
		}
		out = append(out, rawDescriptor{
			key:            d.GetKey(),
			value:          d.GetValue(),
			rateLimit:      rateLimitFromProto(d.GetRateLimit()),
			descriptors:    descriptorsFromProto(d.GetDescriptors()),
			shadowMode:     d.GetShadowMode(),
			quotaMode:      d.GetQuotaMode(),
			detailedMetric: d.GetDetailedMetric(),
			metadata:       protoMetadata(d.GetMetadata()),
		})
	}
	return out
}

func rateLimitFromProto(p *rlsconfv3.RateLimitPolicy) *rawRateLimit {
	if p == nil {
		return nil
	}
	rl := &rawRateLimit{
		requestsPerUnit: p.GetRequestsPerUnit(),
		unit:            unitName(int32(p.GetUnit())),
		unlimited:       p.GetUnlimited(),
		name:            p.GetName(),
	}
	for _, r := range p.GetReplaces() {
		rl.replaces = append(rl.replaces, r.GetName())
	}
	return rl
}

// unitName is the name the reference gives the unit's number: its enum name, upper case, or
// the number itself when it names no unit (refused, as the reference refuses it).
func unitName(n int32) string {
	if u := Unit(n); u.inTable() {
		return strings.ToUpper(u.String())
	}
	return strconv.Itoa(int(n))
}

// protoMetadata is a descriptor's metadata as a file's would be: nil when empty, and a copy,
// so that the Config does not share what the xDS client holds.
func protoMetadata(m *structpb.Struct) *structpb.Struct {
	if len(m.GetFields()) == 0 {
		return nil
	}
	return proto.CloneOf(m)
}
