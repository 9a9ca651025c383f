package cluster

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// eventLog turns a run of per-partition events of one kind (partitions handed
// off, replicas moved) into one INFO line: each event is logged at DEBUG, and
// once no event of the kind came for quiet, one INFO line says how many there
// were, for which nodes, and over how long. Three nodes starting used to log
// about 170 INFO lines, one per partition moved (issue 29).
//
// Its timer is its only goroutine; stop writes what is pending and stops it.
type eventLog struct {
	log   *slog.Logger
	msg   string // the INFO line's message
	key   string // what the count is by: "to", "on"
	quiet time.Duration

	mu      sync.Mutex
	n       int
	by      map[string]int
	first   time.Time
	timer   *time.Timer
	stopped bool
}

// eventQuiet is how long a run of events waits for the next before its line
// is written (a variable for tests).
var eventQuiet = 2 * time.Second

func newEventLog(log *slog.Logger, msg, key string) *eventLog {
	return &eventLog{log: log, msg: msg, key: key, quiet: eventQuiet, by: map[string]int{}}
}

// add records one event (logged at DEBUG with attrs) for node.
func (l *eventLog) add(node string, debugMsg string, attrs ...any) {
	l.log.Debug(debugMsg, attrs...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	if l.n == 0 {
		l.first = time.Now()
	}
	l.n++
	l.by[node]++
	if l.timer == nil {
		l.timer = time.AfterFunc(l.quiet, l.flush)
	} else {
		l.timer.Reset(l.quiet)
	}
}

// flush writes the pending run's line, if any.
func (l *eventLog) flush() {
	l.mu.Lock()
	n, by, first := l.n, l.by, l.first
	l.n, l.by = 0, map[string]int{}
	l.mu.Unlock()
	if n == 0 {
		return
	}
	parts := make([]string, 0, len(by))
	for _, node := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s:%d", node, by[node]))
	}
	l.log.Info(l.msg, "partitions", n, l.key, strings.Join(parts, ","), "over", time.Since(first).Round(time.Millisecond))
}

// stop writes what is pending; later events are logged at DEBUG only.
func (l *eventLog) stop() {
	l.mu.Lock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	l.flush()
}

// memberEvents are a node's runs of per-partition events.
type memberEvents struct {
	handedOff, stopped, moving, moved *eventLog
}

func newMemberEvents(log *slog.Logger) *memberEvents {
	return &memberEvents{
		handedOff: newEventLog(log, "handed partitions off", "to"),
		stopped:   newEventLog(log, "stopped serving partitions (another node took them up)", "owner"),
		moving:    newEventLog(log, "moving replicas (the controller placed them)", "to"),
		moved:     newEventLog(log, "moved replicas (added, caught up, promoted)", "to"),
	}
}

func (e *memberEvents) stop() {
	for _, l := range []*eventLog{e.handedOff, e.stopped, e.moving, e.moved} {
		l.stop()
	}
}
