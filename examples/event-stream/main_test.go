package main

import (
	"context"
	"testing"
	"time"
)

// TestEventStream: two consumer groups handle every produced event exactly once
// while retention moves old records to the cold store; afterwards every
// partition reads back from offset 0 (cold, then hot) with each event in the
// partition of its key, and nothing else; a group that starts after the trim
// handles every event once too.
func TestEventStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	produced, results, err := Run(ctx, rt, 3, 200, map[string]int{"billing": 3, "analytics": 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(produced) != 600 {
		t.Fatalf("produced %d events, want 600", len(produced))
	}
	for g, seen := range results {
		for id := range produced {
			if seen[id] != 1 {
				t.Errorf("group %s handled %s %d times, want once", g, id, seen[id])
			}
		}
		if len(seen) != len(produced) {
			t.Errorf("group %s handled %d distinct events, want %d", g, len(seen), len(produced))
		}
	}
	read := map[string]bool{}
	for p := 0; p < partitions; p++ {
		l := Partition(rt, p)
		if _, err := l.Trim(ctx); err != nil { // what the next automatic trim would do
			t.Fatal(err)
		}
		b, err := l.Bounds(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b.OldestOffset != 0 || b.HotOffset == 0 || b.NextOffset-b.HotOffset > 50 {
			t.Fatalf("partition %d bounds %+v: want records from 0 in the cold store, at most 50 hot", p, b)
		}
		events, err := ReadAll(ctx, l)
		if err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
		if uint64(len(events)) != b.NextOffset {
			t.Fatalf("partition %d: read %d records, want %d", p, len(events), b.NextOffset)
		}
		for _, e := range events {
			if PartitionOf(e.Key) != p || read[e.ID] || produced[e.ID] != e {
				t.Fatalf("partition %d holds %+v: wrong partition, a duplicate, or never produced", p, e)
			}
			read[e.ID] = true
		}
	}
	if len(read) != len(produced) {
		t.Fatalf("read back %d events, want %d", len(read), len(produced))
	}
	// A group that starts now leases from offset 0: mostly from the cold store.
	seen, err := Consume(ctx, rt, "audit", 2, len(produced))
	if err != nil {
		t.Fatal(err)
	}
	for id := range produced {
		if seen[id] != 1 {
			t.Fatalf("late group audit handled %s %d times, want once", id, seen[id])
		}
	}
}
