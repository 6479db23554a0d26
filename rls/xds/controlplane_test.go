package xds_test

import (
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// isACK matches the ACK of version.
func isACK(version string) func(*discoveryv3.DiscoveryRequest) bool {
	return func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetResponseNonce() != "" && r.GetErrorDetail() == nil && r.GetVersionInfo() == version
	}
}

// isNACK matches any NACK.
func isNACK(r *discoveryv3.DiscoveryRequest) bool {
	return r.GetResponseNonce() != "" && r.GetErrorDetail() != nil
}
