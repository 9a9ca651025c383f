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
// A cluster keeps its partitions in one of two ways, fixed when it is created
// (cluster.replicationFactor, recorded in etcd's meta key):
//
//   - One copy (replicationFactor 1, the default). Each partition has one owner,
//     written in etcd (parts/<p>) with an epoch; the owner serves it while it holds
//     its etcd lease; moves stream the keyspace (handoff.go). A node serves a
//     partition only from the data directory it was served from before: every data
//     directory has a storage ID (storageid.go), the table records the one each
//     partition is served from, and a node whose directory has another ID refuses
//     the partition (it stays unavailable) until its disk returns or an operator
//     gives the partition up (ForgetNode).
//   - Replicated (replicationFactor > 1). Each partition is a raft group
//     (package replication) whose replicas etcd places (groups/<p>); a node serves
//     the partitions its replicas lead under the leader lease, and the raft term is
//     the epoch. etcd holds membership and placement only: serving never waits for
//     it.
//
// Files:
//
//   - node.go: Config, Start and Close (the start-up and shut-down order), the
//     node's metrics, Request.
//   - member.go: the cluster half of a node (registration, the etcd session, the
//     fences, reconcile and take-up of owned partitions, request routing of a
//     one-copy cluster); table.go: the etcd schema and the node's view of it;
//     controller.go: placement of a one-copy cluster; handoff.go: its moves;
//     storageid.go: storage identity; session.go: the etcd lease; reach.go: which
//     nodes a node cannot reach.
//   - replicated.go: the raft half of a replicated node (the WAL pipeline, carrier,
//     transport and engine; forming groups; running the replicas placed on this
//     node's data directory; serving under the lease; routing to leaders;
//     leadership balancing and the stuck-lease handover; leave); moves.go: replica
//     moves (join, leave, repair after replaceAfter, wiped disks, growing groups
//     formed with fewer nodes; ending a removed replica's log); replicastatus.go:
//     the replica reports in etcd, the replicated `cluster status`, raft metrics;
//     recover.go: recover-partition (a partition that lost its majority restarts
//     from its best survivor).
//   - remote.go, wire.go: the transport between members (requests, replies and
//     one-way messages in frames over TCP, batched per connection; a request
//     for an object starts on the connection's reader); wirecodec.go,
//     wirefast.go: MessagePack by hand on byte slices for the envelopes and the
//     hot-path messages; feed.go:
//     live feeds of objects served by another node; client.go: client members;
//     admin.go: the operator commands (status, leave, forget-node); list.go:
//     listing a type's keys across every partition and node.
//
// Node's methods may be called from any goroutine once Start returned.
package cluster
