// Command event-stream is a Kafka-shaped topic on an embedded Holdfast runtime: a
// topic is N partition objects whose retained logs hold the records; producers
// hash each record's key to a partition; each consumer group is one log consumer
// whose members lease ranges of any partition in parallel and ack them; retention
// moves old records to a cold store, where they stay readable.
//
//	go run ./examples/event-stream
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/actors"
	coldfs "github.com/holdfast/holdfast/cold/fs"
)

const (
	app        = "app_example"
	topic      = "orders" // the object type of the topic's partitions
	partitions = 4
)

// Event is a record's body.
type Event struct {
	ID  string `json:"id"`  // unique: the record's deduplication key
	Key string `json:"key"` // what picks the partition: one customer's events stay in order
}

// Open opens a runtime whose partitions keep 50 records hot, trim every 100ms
// into a cold store on disk, and let 3 members of a group hold leases at once.
func Open(dir string) (*holdfast.Runtime, error) {
	store, err := coldfs.Open(filepath.Join(dir, "cold"))
	if err != nil {
		return nil, err
	}
	return holdfast.Open(holdfast.Options{DataDir: filepath.Join(dir, "db"), Cold: store,
		TypeOptions: func(typ string) holdfast.TypeOptions {
			o := actors.DefaultTypeOptions()
			if typ == topic {
				o.Log = holdfast.LogOptions{MaxBatchSize: 20, MaxRecords: 50, TrimEvery: 100 * time.Millisecond, Cold: true,
					Leases: &holdfast.LeaseOptions{MaxParallelism: 3, LeaseDuration: 10 * time.Second}}
			}
			return o
		}})
}

// PartitionOf returns the partition of key: every event of one key goes to one
// partition, in order.
func PartitionOf(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % partitions)
}

// Partition returns the log of partition p: the object (app, topic, p).
func Partition(rt *holdfast.Runtime, p int) *holdfast.Log {
	return rt.Log(app, topic, fmt.Sprint(p))
}

// Produce appends n events from each of producers goroutines and returns them
// by ID. An append is durable when it returns; a retry with the same
// deduplication key would not write the record twice.
func Produce(ctx context.Context, rt *holdfast.Runtime, producers, n int) (map[string]Event, error) {
	var mu sync.Mutex
	all := map[string]Event{}
	err := parallel(producers, func(p int) error {
		for i := 0; i < n; i++ {
			e := Event{ID: fmt.Sprintf("p%d-%d", p, i), Key: fmt.Sprintf("customer-%d", (p*7+i)%23)}
			body, _ := json.Marshal(e)
			if _, err := Partition(rt, PartitionOf(e.Key)).Append(ctx, holdfast.LogInput{Body: body, DeduplicationKey: &e.ID}); err != nil {
				return err
			}
			mu.Lock()
			all[e.ID] = e
			mu.Unlock()
		}
		return nil
	})
	return all, err
}

// Consume runs a consumer group of members goroutines until it has handled
// total records, and returns how many times it handled each event ID. A member
// leases up to 10 records of one partition, handles them, and acks: the group's
// cursor on each partition moves over every acked range. A lease that is not
// acked in time would go to another member.
func Consume(ctx context.Context, rt *holdfast.Runtime, group string, members, total int) (map[string]int, error) {
	var mu sync.Mutex
	seen := map[string]int{}
	handled := 0
	err := parallel(members, func(m int) error {
		for p := m; ctx.Err() == nil; p++ {
			mu.Lock()
			done := handled >= total
			mu.Unlock()
			if done {
				return nil
			}
			l := Partition(rt, p%partitions)
			lease, err := l.Lease(ctx, group, 10)
			if err != nil {
				return fmt.Errorf("%s: lease: %w", group, err)
			}
			if lease == nil {
				time.Sleep(5 * time.Millisecond) // nothing to do on this partition now
				continue
			}
			mu.Lock()
			for _, r := range lease.Records { // the group's work
				var e Event
				_ = json.Unmarshal(r.Body, &e)
				seen[e.ID]++
				handled++
			}
			mu.Unlock()
			if _, err := l.Ack(ctx, group, lease.BatchID); err != nil {
				return fmt.Errorf("%s: ack: %w", group, err)
			}
		}
		return ctx.Err()
	})
	return seen, err
}

// parallel runs f(0) .. f(n-1) in goroutines and returns the first error.
func parallel(n int, f func(i int) error) error {
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { errs <- f(i) }()
	}
	var first error
	for i := 0; i < n; i++ {
		if err := <-errs; first == nil {
			first = err
		}
	}
	return first
}

// ReadAll reads a partition from its oldest offset, from the cold store where the hot
// window no longer holds it.
func ReadAll(ctx context.Context, l *holdfast.Log) ([]Event, error) {
	b, err := l.Bounds(ctx)
	if err != nil {
		return nil, err
	}
	var out []Event
	for from := b.OldestOffset; from < b.NextOffset; {
		page, err := l.Read(ctx, from, 0)
		if err != nil {
			return nil, fmt.Errorf("read from %d: %w", from, err)
		}
		for _, r := range page.Records {
			var e Event
			_ = json.Unmarshal(r.Body, &e)
			out = append(out, e)
		}
		from = page.NextOffset
	}
	return out, nil
}

// Run produces n events from each of producers goroutines while every group
// consumes them, and returns what was produced and what each group handled.
func Run(ctx context.Context, rt *holdfast.Runtime, producers, n int, groups map[string]int) (map[string]Event, map[string]map[string]int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var produced map[string]Event
	results := map[string]map[string]int{}
	var mu sync.Mutex
	names := slices.Sorted(maps.Keys(groups))
	err := parallel(len(groups)+1, func(i int) (err error) {
		defer func() {
			if err != nil {
				cancel() // stop the others
			}
		}()
		if i == len(groups) {
			produced, err = Produce(ctx, rt, producers, n)
			return err
		}
		seen, err := Consume(ctx, rt, names[i], groups[names[i]], producers*n)
		mu.Lock()
		results[names[i]] = seen
		mu.Unlock()
		return err
	})
	return produced, results, err
}

func main() {
	dir, err := os.MkdirTemp("", "holdfast-event-stream-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := Open(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close(ctx)
	produced, results, err := Run(ctx, rt, 3, 200, map[string]int{"billing": 3, "analytics": 2})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("produced %d events\n", len(produced))
	for _, g := range slices.Sorted(maps.Keys(results)) {
		seen := results[g]
		fmt.Printf("group %s handled %d distinct events\n", g, len(seen))
	}
	for p := 0; p < partitions; p++ {
		l := Partition(rt, p)
		if _, err := l.Trim(ctx); err != nil { // what the next automatic trim would do
			log.Fatal(err)
		}
		b, err := l.Bounds(ctx)
		if err != nil {
			log.Fatal(err)
		}
		events, err := ReadAll(ctx, l) // cold, then hot
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("partition %d: offsets %d..%d, %d of them in the cold store, %d read back\n",
			p, b.OldestOffset, b.NextOffset-1, b.HotOffset-b.OldestOffset, len(events))
	}
}
