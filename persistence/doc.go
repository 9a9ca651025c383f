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
// Submit, which never waits for disk; the goroutine drains everything queued into one
// record of the write-ahead log (wal.go), made durable with one fdatasync, whose
// changes Badger gets at the record's sequence number as their version. Only
// then does it complete each Write's Ticket. Tickets complete in submission order,
// so waiting for the latest Ticket of an actor covers every earlier write of it.
//
// A record's payload is its writes' changes in order: set (key, value), delete
// (key), and set-part (key, then which earlier set of the record, an offset and a
// length), for a value that is part of another value of the same write (a KV slot
// and the change-log entry that holds it), so the log stores those bytes once.
//
// Badger applies records off the acknowledgement's path, on one applier goroutine,
// and only records the log made durable: Badger never holds a version that a
// crash could take out of the log.
// When records wait for it, it applies them together at the newest one's version
// (a key written by several goes to Badger once), in key order, through Badger's
// KVLoader rather than a transaction; reads are always at the newest version and
// versions are only compared with older marks, so the merge is invisible.
//
// Durability. Badger runs in managed mode without syncing; the log is the
// durability point. Open replays every retained log record into Badger at its
// version, which makes replay idempotent: a version Badger already holds is written
// again with the same value. A log segment is released only once Badger holds all
// its records in synced tables (and its value log is synced): records below the
// newest version of Badger's tables, since a large batch can span two memtables, so
// the newest version may be only partly flushed. A released segment
// is renamed out of the log, durably, so it can never be replayed over newer history.
// A clean Close flushes Badger and removes the log.
//
// Values of 1 MiB and more live in Badger's value log, which Badger neither
// syncs nor reclaims on its own: the release syncs every value-log file, and
// the pipeline runs Badger's value-log GC so that it deletes a file only once
// the copies it made are synced (valuelog.go).
//
// A failed commit (a failed write or sync) is not retried: after it the pipeline
// refuses every later Write with ErrFailed, because what the log's file holds is
// unknown after a failed fdatasync (the kernel may have dropped the pages). Its
// writes never reach Badger. The node must restart.
package persistence
