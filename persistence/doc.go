// Package persistence owns the node's Badger database, the key layout of object
// keyspaces, and the commit pipeline that makes every write durable.
//
// Key layout. Every key of an object lives under
//
//	'p' | partition (uint16, big endian) | object | behaviour (1 byte) | suffix
//
// where object is the length-prefixed app, type and key (uint16 length, then the
// bytes). Length prefixes make the encoding prefix-free, so one partition
// (PartitionPrefix) or one object (ObjectPrefix) or one behaviour of one object
// (Keyspace.Prefix) can be scanned, copied or dropped by prefix. Node metadata lives
// under 'm'.
//
// Commit pipeline. Pipeline has one owning goroutine. Actors hand it Writes with
// Submit, which never waits for disk; the goroutine drains everything queued into
// one Badger transaction, commits it with SyncWrites (one WAL sync per transaction),
// and only then completes each Write's Ticket. A Ticket is completed exactly once,
// and Tickets complete in submission order, so waiting for the latest Ticket of an
// actor covers every earlier write of that actor.
//
// A failed commit (a failed write or sync) is not retried: after it the pipeline
// refuses every later Write with ErrFailed, because Badger's in-memory state may
// already hold the unsynced entries. The node must restart.
package persistence
