package config

import (
	"encoding/base64"
	"strconv"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// metadata reads a descriptor's metadata, a key of the reference's newer versions: any YAML
// map, whose content is not checked against the known keys, kept with the descriptor's rule
// (RateLimit.Metadata) as a protobuf Struct, as the newer reference keeps it. null, or an
// empty map, is none. Anything but a map is refused, as the reference's YAML decoder refuses
// it, and so is a binary value that is not UTF-8 text, which a Struct cannot hold.
func (r *yamlReader) metadata(n *yaml.Node) (*structpb.Struct, error) {
	n, err := r.deref(n)
	if err != nil {
		return nil, err
	}
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, r.typeErr(n, "a metadata map")
	}
	v, err := r.metadataValue(n, 0)
	if err != nil {
		return nil, err
	}
	s := v.GetStructValue()
	if len(s.GetFields()) == 0 {
		return nil, nil
	}
	return s, nil
}

// metadataValue is one node of a descriptor's metadata as a Struct's value: a map's keys as
// written, the later of a key given twice, scalars by their YAML 1.1 type as the reference's
// decoder reads them (a timestamp stays text).
func (r *yamlReader) metadataValue(n *yaml.Node, depth int) (*structpb.Value, error) {
	if depth > maxDepth {
		return nil, invalid(r.file, n.Line, "error loading config file: metadata nested more than %d deep", maxDepth)
	}
	n, err := r.deref(n)
	if err != nil {
		return nil, err
	}
	switch n.Kind {
	case yaml.MappingNode:
		ps, err := r.pairs(n)
		if err != nil {
			return nil, err
		}
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(ps))}
		for _, p := range ps {
			if p.key.Kind != yaml.ScalarNode {
				return nil, invalid(r.file, p.key.Line, "error parsing metadata: a key is %s, not a scalar", show(p.key))
			}
			v, err := r.metadataValue(p.value, depth+1)
			if err != nil {
				return nil, err
			}
			s.Fields[p.key.Value] = v
		}
		return structpb.NewStructValue(s), nil
	case yaml.SequenceNode:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(n.Content))}
		for _, e := range n.Content {
			v, err := r.metadataValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			l.Values = append(l.Values, v)
		}
		return structpb.NewListValue(l), nil
	}
	return r.metadataScalar(n)
}

func (r *yamlReader) metadataScalar(n *yaml.Node) (*structpb.Value, error) {
	switch n.ShortTag() {
	case "!!null":
		return structpb.NewNullValue(), nil
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return structpb.NewBoolValue(b), nil
		}
	case "!!int":
		var i int64
		if n.Decode(&i) == nil {
			return structpb.NewNumberValue(float64(i)), nil
		}
		var u uint64
		if n.Decode(&u) == nil {
			return structpb.NewNumberValue(float64(u)), nil
		}
		if f, err := strconv.ParseFloat(n.Value, 64); err == nil {
			return structpb.NewNumberValue(f), nil
		}
	case "!!float":
		var f float64
		if n.Decode(&f) == nil {
			return structpb.NewNumberValue(f), nil
		}
	case "!!str":
		if b, ok := yaml11Bool(n); ok {
			return structpb.NewBoolValue(b), nil
		}
	case "!!binary":
		b, err := base64.StdEncoding.DecodeString(n.Value)
		if err != nil || !utf8.Valid(b) {
			return nil, invalid(r.file, n.Line, "error parsing metadata: a binary value is not UTF-8 text")
		}
		return structpb.NewStringValue(string(b)), nil
	}
	return structpb.NewStringValue(n.Value), nil
}
