package engine

import "github.com/valkey-io/valkey-go"

// SendPeeksToReplicas is a valkey.ClientOption.SendToReplicas function that sends read-only
// scripts (EVALSHA_RO, EVAL_RO: the engine's Peek and Check) to replicas, and everything else
// to primaries. Routing is the client's job, so this is how a user asks for replica reads:
//
//	valkey.NewClient(valkey.ClientOption{InitAddress: addrs, SendToReplicas: engine.SendPeeksToReplicas})
//
// List only primaries in InitAddress: valkey-go keeps the plain connection it opened to a
// replica named there, which then answers reads with MOVED (to the primary, so the Peek still
// succeeds, but not on the replica). A replica answers from its copy, which lags the primary by the replication delay: a Peek
// there may miss the latest admissions. Decisions (Allow, AllowN) always go to the primary.
func SendPeeksToReplicas(cmd valkey.Completed) bool {
	if !cmd.IsReadOnly() {
		return false
	}
	name := cmd.Commands()[0]
	return name == "EVALSHA_RO" || name == "EVAL_RO"
}
