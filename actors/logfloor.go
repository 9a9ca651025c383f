package actors

// Change-log ids after data loss (issue 26; docs/decisions.md).
//
// An object's log_id never goes back, not even when its stored state is lost
// (`holdfast cluster forget-node --accept-data-loss`): a client resuming after
// the last log_id it saw must then get log_truncated, never a quiet empty page
// from an object that counts again from 1. So an object that first writes with
// no stored state starts its log above a floor derived from how many times its
// partition's data was given up: the partition table in etcd counts them
// (cluster.PartEntry.Losses; forget-node adds one to each partition it gives
// away), so the node that serves a partition after a loss starts its new
// objects above every log_id issued before it. The floor is just the first
// entry's log_id minus one, stored with the first write like every log_id;
// nothing else is recorded.
//
// floor(n) = n << 32 for n losses: a single node, and a cluster that never
// lost a partition, number 1, 2, 3. (An earlier version derived the floor from
// the ownership epoch, which every handoff raises: new objects of a cluster
// then started near 2^32 for no loss at all.) Every loss leaves room for 2^32
// log_ids: a lost object's log_ids are below the new floor as long as it made
// fewer than 2^32 writes since its own floor, and log_ids stay below 2^53
// (exact in JavaScript) for 2^21 losses of one partition; past that the floor
// stops rising.

const (
	logFloorShift = 32
	// maxFloorLosses bounds the losses counted so that floors stay below 2^53.
	maxFloorLosses = 1 << (53 - logFloorShift)
)

// logFloor is the log_id before the first change-log entry of an object that
// starts with no stored state in a partition whose data was lost losses times.
func logFloor(losses uint64) uint64 {
	return min(losses, maxFloorLosses-1) << logFloorShift
}

// ResumeAfter checks a reader's resume point after against an object's change
// log, whose oldest entry held is oldest (>= 1; newest+1 when it holds none)
// and whose newest log_id is newest (0 for an object that never wrote). It
// returns the log_id to read after, or a *LogTruncatedError when the log cannot
// go on exactly from there: entries after it were compacted away, or the object
// never issued it (it is above newest: the object lost its state and started
// again at a higher floor, or the client made it up).
//
// after 0 means "from the beginning": it reads from the first entry the object
// ever recorded, if the log still holds it. That entry follows a floor (a
// multiple of 2^32), which is how the log tells that it holds it; an object
// whose retention happens to end exactly on such a multiple (after 2^32
// writes) answers after=0 with the entries it holds instead of 410.
func ResumeAfter(after, oldest, newest uint64) (uint64, error) {
	base := oldest - 1
	if after == 0 && base%(1<<logFloorShift) == 0 {
		return base, nil
	}
	if after < base || after > newest {
		return 0, &LogTruncatedError{After: after, Oldest: oldest, Newest: newest}
	}
	return after, nil
}
