package actors

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/holdfast/holdfast/persistence"
)

// QueueDepth is the number of (message, target) pairs in each state over
// every queue of the partitions a node serves (the node's metrics). Pending
// includes delayed pairs; Processing includes deliveries past their deadline
// that no receive has expired yet. Queues counts the queue objects read.
type QueueDepth struct {
	Queues     int
	Pending    int64
	Processing int64
	Complete   int64
	Failed     int64
}

func queueObjectKey(part uint32, id ObjectID) []byte {
	return persistence.AppendObjectID(persistence.PartitionIndexPrefix(part, indexQueueObjects), id)
}

// QueueDepth adds up the counts that every queue of the served partitions
// keeps in its meta record: one scan of each partition's list of queue objects
// (indexQueueObjects) and one read per queue, after every write
// acknowledged before the call reached Badger. Its cost grows with the number
// of queues, not with their messages.
func (h *Host) QueueDepth(ctx context.Context) (QueueDepth, error) {
	var d QueueDepth
	if err := h.pipe.WaitApplied(ctx); err != nil {
		return d, err
	}
	for _, p := range h.partitions() {
		ids, err := h.indexedObjects(ctx, p, indexQueueObjects)
		if err != nil {
			return d, fmt.Errorf("partition %d: %w", p, err)
		}
		for _, id := range ids {
			v, found, err := h.db.Get(ctx, persistence.NewKeyspace(p, id, behaviourQueue).Key(queueMeta, nil))
			if err != nil {
				return d, fmt.Errorf("queue %s: %w", id, err)
			}
			if !found {
				continue
			}
			var m queueMetaRec
			if err := json.Unmarshal(v, &m); err != nil {
				return d, fmt.Errorf("queue %s: %w", id, err)
			}
			d.Queues++
			d.Pending += int64(m.Pending)
			d.Processing += int64(m.Processing)
			d.Complete += int64(m.Complete)
			d.Failed += int64(m.Failed)
		}
	}
	return d, nil
}
