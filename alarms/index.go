package alarms

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Due is one index entry: an occurrence of an alarm and when it is due.
type Due struct {
	At        int64 // unix milliseconds
	Partition uint32
	ID        persistence.ObjectID
	Name      string
	Gen       uint64 // the occurrence's generation
}

func encodeAt(at int64) uint64 { return uint64(at) ^ (1 << 63) } // negative times sort first

// IndexKind is the partition index kind of the alarm index
// (persistence.PartitionIndexPrefix); actors/keys.go lists every kind.
const IndexKind byte = 't'

// IndexKey returns the index key of an occurrence of alarm name of object id,
// due at (unix ms), in partition p.
func IndexKey(p uint32, at int64, id persistence.ObjectID, name string) []byte {
	prefix := persistence.PartitionIndexPrefix(p, IndexKind)
	b := make([]byte, 0, len(prefix)+8+6+len(id.App)+len(id.Type)+len(id.Key)+len(name))
	b = append(b, prefix...)
	b = binary.BigEndian.AppendUint64(b, encodeAt(at))
	b = persistence.AppendObjectID(b, id)
	return append(b, name...)
}

// atKey returns the first index key of partition p due at or after at.
func atKey(p uint32, at int64) []byte {
	return binary.BigEndian.AppendUint64(persistence.PartitionIndexPrefix(p, IndexKind), encodeAt(at))
}

// IndexValue is the value of an index entry: the occurrence's generation.
func IndexValue(gen uint64) []byte { return binary.BigEndian.AppendUint64(nil, gen) }

var errBadIndexEntry = errors.New("alarms: malformed index entry")

// DecodeIndex decodes an index entry of partition p.
func DecodeIndex(p uint32, key, value []byte) (Due, error) {
	n := len(persistence.PartitionIndexPrefix(p, IndexKind))
	if len(key) < n+8 || len(value) != 8 {
		return Due{}, errBadIndexEntry
	}
	d := Due{Partition: p, At: int64(binary.BigEndian.Uint64(key[n:]) ^ (1 << 63)), Gen: binary.BigEndian.Uint64(value)}
	id, rest, ok := persistence.DecodeObjectID(key[n+8:])
	if !ok {
		return Due{}, errBadIndexEntry
	}
	d.ID = id
	d.Name = string(rest)
	return d, nil
}

// IdempotencyKey is the stable key of one occurrence: the same for every attempt,
// different for every other occurrence of any alarm of any object.
func IdempotencyKey(id persistence.ObjectID, name string, gen uint64) string {
	h := sha256.New()
	for _, s := range [...]string{id.App, id.Type, id.Key, name} {
		_, _ = h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(s))))
		_, _ = h.Write([]byte(s))
	}
	_, _ = h.Write(binary.BigEndian.AppendUint64(nil, gen))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Retry policy (spec/alarms.md): exponential backoff from 1s, doubling, capped at
// 5m, with jitter.
const (
	FirstBackoff = time.Second
	MaxBackoff   = 5 * time.Minute
	// DefaultMaxAttempts is the attempts an occurrence gets before it is failed.
	DefaultMaxAttempts = 5
)

// Backoff returns the wait before the next attempt after failures failed
// attempts (1 after the first). jitter in [0, 1) takes up to a fifth off the
// schedule, so retries of many alarms that failed together spread out while
// none waits longer than the schedule says: 1s, 2s, 4s, ... 5m.
func Backoff(failures int, jitter float64) time.Duration {
	base := MaxBackoff
	if failures < 1 {
		failures = 1
	}
	if e := failures - 1; e < 30 {
		base = min(FirstBackoff<<e, MaxBackoff)
	}
	jitter = math.Min(math.Max(jitter, 0), 1)
	return base - time.Duration(float64(base)*0.2*jitter)
}
