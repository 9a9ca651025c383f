// Package cluster starts a node and routes every message to the one activation of
// its object. It owns the node's start-up order (database, commit pipeline, actor
// host), the partition table with its ownership epochs, and the fence that the
// commit pipeline asks before each commit.
//
// A single node is a cluster of one: it owns every partition at epoch 1. Request
// hashes an object to its partition and, since the owner is this node, hands the
// message to the local actor host. Several nodes (membership, placement through
// etcd, handoff) plug in behind the same Request without changing the actors.
//
// A node of a cluster serves a partition only from the data directory it was
// served from before: every data directory has a storage ID (storageid.go),
// the table records the one each partition is served from, and a node whose
// directory has another ID refuses the partition (it stays unavailable) until
// its disk returns or an operator gives the partition up (ForgetNode).
//
// Node's methods may be called from any goroutine once Start returned.
package cluster
