package actors

import "github.com/holdfast/holdfast/alarms"

// The bytes that divide storage among the behaviours. persistence knows the
// layout (an object's keyspace, a partition's indexes), not what lives where:
// adding a behaviour adds its byte here, and persistence does not change.

// Behaviour bytes: each behaviour of an object owns the keys under its byte
// (persistence.NewKeyspace). They must differ from one another.
const (
	behaviourKV    byte = 'k' // KV slots, change log, idempotency records
	behaviourUser  byte = 'u' // storage of user-defined object types
	behaviourLog   byte = 'l' // the retained log: records, deduplication index, cursors
	behaviourAlarm byte = 'a' // named alarms: one record per name, the generation counter
	behaviourQueue byte = 'q' // the write-ahead queue: messages, pairs, their indexes
)

// Partition index kinds (persistence.PartitionIndexPrefix). They must differ from one another
// (TestKeys_EveryByteIsDistinct).
const (
	// indexAlarms is the alarm scheduler's index by due time; the alarms
	// package owns its byte and its entries.
	indexAlarms = alarms.IndexKind
	// indexQueues lists the partition's objects whose queues have deliveries
	// in flight.
	indexQueues byte = 'q'
	// indexQueueObjects lists every object of the partition that has a queue
	// (the node's queue depth, read at scrape time).
	indexQueueObjects byte = 'Q'
)
