package config

import (
	"time"
)

// TypeConfig is the settings of one object type, as Type returns them: every field resolved,
// none left to a default by its reader.
type TypeConfig struct {
	Objects ObjectsConfig
	Log     LogConfig
	Queue   QueueConfig
	Alarms  AlarmsConfig
}

// ObjectsConfig is types.<name>.objects (spec/objects.md).
type ObjectsConfig struct {
	ChangeLogEntries int // change-log entries kept per object; default 10000, >= 1
}

// LogConfig is types.<name>.log (spec/log.md).
type LogConfig struct {
	MaxBatchSize int // records per append, read page and cold segment; default 100, >= 1
	Retention    Retention
	Cold         bool    // trimmed records go to the cold store first; default false
	Leases       *Leases // nil: leasing is off (`leases: null`, the default)
}

// Retention is types.<name>.log.retention. A zero limit is no limit.
type Retention struct {
	MaxAge     time.Duration // >= 0
	MaxRecords int64         // >= 0
	MaxBytes   int64         // payload bytes held hot; 0..1073741824 (1 GiB)
	// TrimEvery is resolved: the value the file set for this type or "*" (0s = no periodic
	// trim) or, when neither set it, 1m if MaxAge, MaxRecords or MaxBytes is set and 0 if
	// none is. A TrimEvery set with no limit is returned as set (trim then removes nothing).
	TrimEvery time.Duration
}

// Leases is types.<name>.log.leases.
type Leases struct {
	MaxParallelism int           // ranges one consumer may hold; default 1, >= 1
	LeaseDuration  time.Duration // default 30s, > 0
	MaxAttempts    int           // deliveries before dead-lettering; default 0 = unlimited
}

// QueueConfig is types.<name>.queue (spec/queue.md).
type QueueConfig struct {
	Targets             []string      // default [default]; at least one, distinct, not empty
	MaxAttempts         int           // default 5, >= 1
	VisibilityTimeout   time.Duration // default 30s, > 0
	Backoff             Backoff
	CompletedRetention  time.Duration // default 24h, > 0
	DeadLetterRetention time.Duration // default 336h, > 0
	MaxPending          int64         // default 1,000,000, >= 1
	Concurrency         int           // messages of one queue in flight; default 1, >= 1
}

// Backoff is the retry backoff (before jitter): Initial, times Multiplier per attempt, at
// most Max.
type Backoff struct {
	Initial    time.Duration // default 1s, > 0
	Multiplier float64       // default 2, >= 1
	Max        time.Duration // default 5m, >= Initial
}

// AlarmsConfig is types.<name>.alarms (spec/alarms.md).
type AlarmsConfig struct {
	MaxAttempts int // default 5, >= 1
	// MaxPerObject caps an object's alarm names that clients may schedule (pending or
	// failed; the runtime's own are not counted); default 10000, >= 1.
	MaxPerObject int
}

// leaves is the schema of types.<name>, with the defaults and ranges of its values.
var leaves = map[string]leaf{
	"objects.changeLogEntries":  {kindInt, int64(10000), 1, 0},
	"log.maxBatchSize":          {kindInt, int64(100), 1, 0},
	"log.retention.maxAge":      {kindDuration, time.Duration(0), 0, 0},
	"log.retention.maxRecords":  {kindInt, int64(0), 0, 0},
	"log.retention.maxBytes":    {kindInt, int64(0), 0, 1 << 30},
	"log.retention.trimEvery":   {kindDuration, nil, 0, 0}, // default resolved in Type
	"log.cold":                  {kindBool, false, 0, 0},
	"log.leases.maxParallelism": {kindInt, int64(1), 1, 0},
	"log.leases.leaseDuration":  {kindDuration, 30 * time.Second, 1, 0},
	"log.leases.maxAttempts":    {kindInt, int64(0), 0, 0},
	"queue.targets":             {kindList, []string{"default"}, 0, 0},
	"queue.maxAttempts":         {kindInt, int64(5), 1, 0},
	"queue.visibilityTimeout":   {kindDuration, 30 * time.Second, 1, 0},
	"queue.backoff.initial":     {kindDuration, time.Second, 1, 0},
	"queue.backoff.multiplier":  {kindNumber, float64(2), 1, 0},
	"queue.backoff.max":         {kindDuration, 5 * time.Minute, 1, 0},
	"queue.completedRetention":  {kindDuration, 24 * time.Hour, 1, 0},
	"queue.deadLetterRetention": {kindDuration, 336 * time.Hour, 1, 0},
	"queue.maxPending":          {kindInt, int64(1000000), 1, 0},
	"queue.concurrency":         {kindInt, int64(1), 1, 0},
	"alarms.maxAttempts":        {kindInt, int64(5), 1, 0},
	"alarms.maxPerObject":       {kindInt, int64(10000), 1, 0},

	"objects": {kind: kindSection}, "log": {kind: kindSection}, "log.retention": {kind: kindSection},
	"log.leases": {kind: kindSwitch}, "queue": {kind: kindSection}, "queue.backoff": {kind: kindSection},
	"alarms": {kind: kindSection},
}

// Type returns the settings of object type name: the "*" settings with the type's own keys
// laid over them key by key (a type that sets only log.retention.maxAge keeps every other log
// and retention key from "*"), then built-in defaults for anything neither sets. `leases:
// null` in the type turns leases off even when "*" has them; a leases mapping in the type is
// laid over the "*" leases key by key. Type is safe for concurrent use once Load or Validate
// has returned; the result shares nothing with c.
func (c *Config) Type(name string) TypeConfig {
	star, own := c.types["*"], c.types[name]
	if name == "*" {
		own = nil
	}
	get := func(k string) (any, bool) {
		if v, ok := own[k]; ok {
			return v, true
		}
		v, ok := star[k]
		return v, ok
	}
	val := func(k string) any {
		if v, ok := get(k); ok {
			return v
		}
		return leaves[k].def
	}
	i := func(k string) int64 { return val(k).(int64) }
	d := func(k string) time.Duration { return val(k).(time.Duration) }

	var t TypeConfig
	t.Objects.ChangeLogEntries = int(i("objects.changeLogEntries"))
	t.Log.MaxBatchSize = int(i("log.maxBatchSize"))
	r := &t.Log.Retention
	r.MaxAge, r.MaxRecords, r.MaxBytes = d("log.retention.maxAge"), i("log.retention.maxRecords"), i("log.retention.maxBytes")
	if v, ok := get("log.retention.trimEvery"); ok {
		r.TrimEvery = v.(time.Duration)
	} else if r.MaxAge > 0 || r.MaxRecords > 0 || r.MaxBytes > 0 {
		r.TrimEvery = time.Minute
	}
	t.Log.Cold = val("log.cold").(bool)
	if on, ok := get("log.leases"); ok && on.(bool) {
		t.Log.Leases = &Leases{
			MaxParallelism: int(i("log.leases.maxParallelism")),
			LeaseDuration:  d("log.leases.leaseDuration"),
			MaxAttempts:    int(i("log.leases.maxAttempts")),
		}
	}
	q := &t.Queue
	q.Targets = append([]string(nil), val("queue.targets").([]string)...)
	q.MaxAttempts = int(i("queue.maxAttempts"))
	q.VisibilityTimeout = d("queue.visibilityTimeout")
	q.Backoff = Backoff{d("queue.backoff.initial"), val("queue.backoff.multiplier").(float64), d("queue.backoff.max")}
	q.CompletedRetention, q.DeadLetterRetention = d("queue.completedRetention"), d("queue.deadLetterRetention")
	q.MaxPending = i("queue.maxPending")
	q.Concurrency = int(i("queue.concurrency"))
	t.Alarms.MaxAttempts = int(i("alarms.maxAttempts"))
	t.Alarms.MaxPerObject = int(i("alarms.maxPerObject"))
	return t
}

// FlushesCold reports whether any object type's log flushes trimmed records
// to the cold store (log.cold true in "*" or in a type of its own): a node
// whose types never do reads and writes no cold segment.
func (c *Config) FlushesCold() bool {
	if c.Type("*").Log.Cold {
		return true
	}
	for name := range c.types {
		if c.Type(name).Log.Cold {
			return true
		}
	}
	return false
}
