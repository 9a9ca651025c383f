// Package persistence owns the node's Badger database, the key layout of object
// keyspaces, and the commit pipeline that makes every write durable.
//
// # Map
//
//	keys.go       the key layout: partitions, objects, keyspaces, partition indexes
//	ticket.go     Write (one actor's atomic change) and Ticket (its outcome)
//	pipeline.go   Pipeline: configuration, Submit/Queue/Help, bounds, Barrier
//	committer.go  the committer: a batch of writes -> one log record, one sync
//	applier.go    the applier: durable records -> Badger, merged when they wait
//	release.go    the releaser: log segments Badger holds in synced tables go
//	holds.go      the one owner of Badger's discard version (HoldVersions)
//	gcloop.go     Badger's value-log GC, run by the pipeline
//	wal.go        the write-ahead log: segments, records, rotation, release
//	walpage.go    the page writer (O_DIRECT, RWF_DSYNC) under the log
//	recovery.go   strict replay: what Open accepts, CorruptionError
//	raftrecord.go the raft changes of a record: blocks, truncations, states
//	raftlog.go    the raft index: each replica's log as the WAL holds it
//	raftstorage.go RaftStorage, a replica's log as a raft.Storage
//	raftappend.go AppendRaft, TruncateRaft: raft jobs through the committer
//	replicated.go replicated mode: the version counter, ApplyRaft, RaftFlushed, Flush
//	repair.go     RepairWAL, the operator's explicit way past damage
//	valuelog.go   syncing and collecting Badger's value log
//	db.go         Open, Close, reads, releasable
//	export.go     a partition's keys and changes as a stream (handoff)
//	list.go       a type's object keys in byte order across partitions (listing)
//	errors.go     the errors callers match: ErrFailed, ErrUnavailable, ...
//	plantedbug.go test knobs, false in every program
//	plantedbug_on.go, plantedbug_off.go  the torture's planted bug (build tag plantedbug)
//
// # Key layout
//
// Every key of an object lives under
//
//	'p' | partition (uint16, big endian) | object | behaviour (1 byte) | suffix
//
// where object is the length-prefixed app, type and key (uint16 length, then the
// bytes). Length prefixes make the encoding prefix-free, so one partition
// (PartitionPrefix) or one object (ObjectPrefix) or one behaviour of one object
// (Keyspace.Prefix) can be scanned, copied or dropped by prefix. Node metadata lives
// under 'm'. Which behaviour and index bytes exist is the business of the layers
// above (actors/keys.go).
//
// # The write path
//
// Actors hand the pipeline Writes with Submit or Queue, which never wait for
// disk. The committer (or a writer's goroutine in Help, while the committer is
// parked) drains everything queued into one record of the write-ahead log,
// made durable with one fdatasync; only then are the writes' Tickets completed,
// in submission order, so waiting for an actor's latest Ticket covers every
// earlier write of it. A record's payload is its writes' changes in order: set,
// delete, and set-part (a part of an earlier value of the same record, so the
// log stores those bytes once).
//
// The applier then writes each durable record into Badger, off the
// acknowledgement's path, at the record's sequence number as Badger's version
// (Badger runs in managed mode). Badger never holds a version the log could
// lose. When records wait for it, they go to Badger together at the newest one's
// version, in key order. A batch Badger refuses is retried (for as long as the
// cause is a missing resource, else three times, then the pipeline fails); its
// tickets are marked applied, and the applied mark moves, only once it is in.
// Until then objects keep the writes in their overlays and activations wait
// (WaitApplied), so no read misses an acknowledged write.
//
// A Write's Chain links one activation's writes (ticket.go): once one fails,
// the later ones fail too, and once the chain is retired (its activation left
// the actors' routing table) the committer leaves the rest out of the log. A
// write the committer took just before the retirement becomes durable after
// it, so the committer counts each chain's writes in records not yet ended,
// and the next activation of the object waits for them (Chain.WaitLanded)
// before WaitApplied and its first read.
//
// # Durability, release and recovery
//
// Badger does not sync on its own: the log is the durability point. A log
// segment is released (renamed out of the log, durably, or removed) only once
// every record in it is in Badger's synced tables: below the first record of the
// batch at the newest version of Badger's tables (a batch may span two memtables;
// DB.releasable). Badger's flush syncs the value log and the directory before
// its MANIFEST names a new table (third_party/badger, HOLDFAST PATCHES 1 and 3),
// and the releaser syncs the value log once more before it gives records up.
// The releaser runs on its own goroutine, never under the committer's lock.
//
// Open replays every retained record into Badger at its version (idempotent).
// Replay is strict (recovery.go): only the newest segment's last record may be
// torn and dropped; anything else that fails its checksum, a gap or step back
// in the sequence, or a log that starts beyond Badger stops Open with a
// *CorruptionError naming the file and offset. RepairWAL (`holdfast repair
// wal`) is the explicit way past it. A clean Close flushes Badger and removes
// the log; a Close after the applier could not finish keeps it for the next
// Open.
//
// A node holding raft logs (issue 27, docs/replication-design.md 1.4-1.8)
// keeps them in the same records: the committer logs every queued raft
// append of every group with the local writes, one sync for all. A segment
// is then released only once, besides the rule above, every replica's
// entries in it are below its first index (TruncateRaft), and a clean Close
// keeps the log. Replay rebuilds each replica's log strictly. A truncation
// records the replica's configuration as of its new first index - 1, the
// point the replica restarts from.
//
// Such a node's database is replicated (Config.Replicated, fixed when the
// directory is made; replicated.go): committed raft entries reach Badger
// through the same applier (ApplyRaft), merged with whatever else waits, at
// versions of the applier's own counter instead of record sequence numbers.
// Badger holds no raft state: a replica restarts from the start of its log
// and applies again every committed entry it holds, and may truncate its log
// only past what Badger holds in synced tables (RaftFlushed).
//
// Values of 1 MiB and more live in Badger's value log, which Badger does not
// reclaim on its own: the pipeline runs the value-log GC, and a rewritten file
// is deleted only once the copies are durable (valuelog.go).
//
// # Failures and bounds
//
// A failed write or sync of a log record is the pipeline's end (ErrFailed):
// what the file holds is unknown after a failed fdatasync. A log segment that
// cannot be started or zeroed (no descriptor, no space) only refuses the writes
// of that commit with ErrUnavailable; the next commit tries again. Writes are
// also refused with ErrUnavailable, never absorbed, past MaxQueuedBytes waiting
// for the committer or MaxApplyBacklog waiting for Badger; a refused write fails
// the rest of its chain as a failed one does.
//
// # Directories
//
// Every directory the storage creates is fsynced into its parent
// (internal/durable): Holdfast relies on POSIX's promise only, where a new
// directory entry is durable once its directory is synced. The power-cut test
// (powercut_test.go, on internal/powerfs) holds the storage to exactly that.
package persistence
