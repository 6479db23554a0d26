package rls

import (
	"fmt"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is a response's dynamic_metadata (WithDynamicMetadata), in the reference's
// shape and with its field names: the request's domain, descriptors and hits_addend; the
// descriptors over their limit in quota mode (quotaOver, their indices), and whether a
// limited descriptor's rule has quota_mode; and the merged metadata of the rules of the
// descriptors that passed (limited, answered OK, not over their limit).
func dynamicMetadata(req *pb.RateLimitRequest, plans []descriptorPlan, statuses []*pb.RateLimitResponse_DescriptorStatus, quotaOver []int) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}

	descriptors := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		if d == nil {
			continue
		}
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(fmt.Sprintf("%s=%s", e.GetKey(), e.GetValue())))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			// The override's proto text, as the reference writes it (its String).
			df["limit"] = structpb.NewStringValue(l.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descriptors = append(descriptors, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descriptors})

	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}

	if len(quotaOver) > 0 {
		violations := make([]*structpb.Value, len(quotaOver))
		for i, idx := range quotaOver {
			violations[i] = structpb.NewNumberValue(float64(idx))
		}
		fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: violations})
	}

	// The rules' own quota_mode, as the reference reads it: not the global quota mode.
	quotaRule := false
	for _, p := range plans {
		if p.present && p.match.Limit.QuotaMode {
			quotaRule = true
			break
		}
	}
	fields["quotaModeEnabled"] = structpb.NewBoolValue(quotaRule)

	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	over := 0 // the next index of quotaOver to pass
	for i, p := range plans {
		exceeded := over < len(quotaOver) && quotaOver[over] == i
		if exceeded {
			over++
		}
		if !p.present || exceeded || statuses[i].GetCode() != pb.RateLimitResponse_OK {
			continue
		}
		mergeMetadata(passed, p.match.Limit.Metadata)
	}
	if len(passed.GetFields()) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata adds src's fields to dest as the reference merges the rules' metadata: a key
// that dest has keeps its value, unless both values are maps, which are merged alike. What
// is added is a copy: src is a rule's, shared by every request.
func mergeMetadata(dest, src *structpb.Struct) {
	if dest.Fields == nil && len(src.GetFields()) > 0 {
		dest.Fields = make(map[string]*structpb.Value, len(src.GetFields()))
	}
	for k, v := range src.GetFields() {
		had, ok := dest.Fields[k]
		switch {
		case !ok:
			dest.Fields[k] = proto.CloneOf(v)
		case had.GetStructValue() != nil && v.GetStructValue() != nil:
			mergeMetadata(had.GetStructValue(), v.GetStructValue())
		}
	}
}
