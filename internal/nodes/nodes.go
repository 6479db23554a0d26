// Package nodes lists the nodes a valkey-go client knows, in a stable order, for the checks
// and loads the engine runs on every node at start-up.
package nodes

import (
	"sort"

	"github.com/valkey-io/valkey-go"
)

// Node is one node of a deployment: its address and a client bound to it.
type Node struct {
	Addr   string
	Client valkey.Client
}

// Sorted returns every node client knows (client.Nodes(): one for a standalone server, every
// primary and replica of a cluster), ordered by address, so that a check run on each reports
// the same first failure on every run.
func Sorted(client valkey.Client) []Node {
	all := client.Nodes()
	list := make([]Node, 0, len(all))
	for addr, c := range all {
		list = append(list, Node{Addr: addr, Client: c})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Addr < list[j].Addr })
	return list
}
