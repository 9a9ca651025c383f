package cluster

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// records keeps the log records of every node, DEBUG included.
type records struct {
	mu  sync.Mutex
	all []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.all = append(r.all, rec.Clone())
	r.mu.Unlock()
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// count returns the records of msg at level, and the sum of their attribute
// key's int values.
func (r *records) count(level slog.Level, msg, key string) (n int, sum int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.all {
		if rec.Level != level || rec.Message != msg {
			continue
		}
		n++
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				sum += a.Value.Int64()
			}
			return true
		})
	}
	return n, sum
}

// TestCluster_APartitionMoveIsNotAnInfoLine: three nodes starting move
// partitions to the second and third; each handoff is a DEBUG line, and the
// INFO log says so in one line per run of handoffs, whose counts add up.
func TestCluster_APartitionMoveIsNotAnInfoLine(t *testing.T) {
	old := eventQuiet
	eventQuiet = 300 * time.Millisecond
	defer func() { eventQuiet = old }()
	tc := newTestCluster(t)
	recs := &records{}
	tc.log = recs
	tc.start("a")
	tc.waitStable(30 * time.Second)
	tc.start("b")
	tc.start("c")
	tc.waitStable(30 * time.Second)
	time.Sleep(3 * eventQuiet)
	handoffs, _ := recs.count(slog.LevelDebug, "handed a partition off", "")
	if handoffs < testPartitions/2 {
		t.Fatalf("%d handoffs logged at DEBUG; want at least %d as b and c joined", handoffs, testPartitions/2)
	}
	if n, _ := recs.count(slog.LevelInfo, "handed a partition off", ""); n != 0 {
		t.Fatalf("%d handoffs logged one INFO line each", n)
	}
	lines, summed := recs.count(slog.LevelInfo, "handed partitions off", "partitions")
	if summed != int64(handoffs) || lines == 0 || lines > 4 {
		t.Fatalf("%d INFO lines say %d partitions were handed off; %d were", lines, summed, handoffs)
	}
	t.Logf("%d handoffs, %d INFO lines", handoffs, lines)
}
