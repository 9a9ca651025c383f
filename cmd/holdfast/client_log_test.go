package main

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestClient_Log(t *testing.T) {
	srv := startClientServer(t)
	cliWant(t, srv, "offsets 0 1 2\n", "log", "append", "ev/p1", `{"n": 1}`, `{"n":2}`, `"three"`, "--dedup-key", "k0")
	// The same deduplication key returns the original offset.
	if r := cliJSON(t, srv, "log", "append", "ev/p1", `{"n": "again"}`, "--dedup-key", "k0"); r["offsets"].([]any)[0] != 0.0 {
		t.Fatalf("append of a duplicate key: %v", r)
	}
	cliWant(t, srv, "0 {\"n\":1}\n1 {\"n\":2}\n2 \"three\"\nnext 3 lag 0\n", "log", "read", "ev/p1")
	page := cliJSON(t, srv, "log", "read", "ev/p1", "--from", "1", "--limit", "1")
	recs := page["records"].([]any)
	if len(recs) != 1 || recs[0].(map[string]any)["offset"] != 1.0 || page["nextOffset"] != 2.0 || page["lag"] != 1.0 {
		t.Fatalf("read --from 1 --limit 1 --json: %v", page)
	}

	// Cursors: commit, list, show one.
	cliWant(t, srv, "billing 2\n", "log", "cursors", "ev/p1", "billing", "2")
	cliWant(t, srv, "billing 2\n", "log", "cursors", "ev/p1", "billing", "1") // below: ignored
	cliOK(t, srv, "log", "cursors", "ev/p1", "audit", "0")
	cliWant(t, srv, "audit 0\nbilling 2\n", "log", "cursors", "ev/p1")
	cliWant(t, srv, "billing 2\n", "log", "cursors", "ev/p1", "billing")
	cliWant(t, srv, "oldest 0 hot 0 next 3\n", "log", "bounds", "ev/p1")
	cliWant(t, srv, "backlog 3\n", "log", "load", "ev/p1") // audit's cursor is at 0
	if r := cliJSON(t, srv, "log", "bounds", "ev/p1"); r["nextOffset"] != 3.0 {
		t.Fatalf("bounds --json: %v", r)
	}
	cliWant(t, srv, "removed 0\n", "log", "trim", "ev/p1") // within the type's retention
	if r := cliJSON(t, srv, "log", "cursors", "ev/p1"); r["cursors"].(map[string]any)["billing"] != 2.0 {
		t.Fatalf("cursors --json: %v", r)
	}

	// Tail from an offset: what is there, then what another client appends.
	cliWant(t, srv, "1 {\"n\":2}\n2 \"three\"\n", "log", "tail", "ev/p1", "--from", "1", "--count", "2", "--timeout", "20s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// tail --from 3 follows: the first record comes while it polls, the second
	// only after it printed the first.
	tail := cliCommand(ctx, srv, "log", "tail", "ev/p1", "--from", "3", "--count", "2", "--timeout", "20s", "--interval", "50ms", "--json")
	out, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var got []map[string]any
	for _, body := range []any{"four", map[string]int{"n": 5}} {
		api(t, srv, "POST", "/api/v1/logs/app_crash/ev/p1/append", map[string]any{"records": []map[string]any{{"body": body}}})
		if !sc.Scan() {
			t.Fatalf("tail printed no record after an append: %v", tail.Wait())
		}
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("tail --json printed %q: %v", sc.Text(), err)
		}
		got = append(got, rec)
	}
	if err := tail.Wait(); err != nil || got[0]["offset"] != 3.0 || got[0]["body"] != "four" || got[1]["offset"] != 4.0 {
		t.Fatalf("tail while another client appends: %v, %v", got, err)
	}

	for _, c := range []struct {
		args  []string
		wants []string
	}{
		{[]string{"log", "read", "ev/p1", "--limit", "0"}, []string{"limit must be at least 1", "HTTP 400", "bad_request"}},
		{[]string{"log", "cursors", "ev/p1", "nobody"}, []string{`"nobody" has no cursor`, "HTTP 404"}},
		{[]string{"log", "cursors", "ev/p1", "billing", "99"}, []string{"beyond", "HTTP 422", "invalid"}},
		{[]string{"log", "cursors", "ev/p1", "billing", "x1"}, []string{"OFFSET", "non-negative"}},
		{[]string{"log", "append", "ev/p1", "{oops"}, []string{"BODY", "not valid JSON"}},
		{[]string{"log", "append", "ev/p1", "1", "--dedup-key", ""}, []string{"HTTP 422"}},
		{[]string{"log", "append", "ev/p1", "1", "--dedup-key", "a", "--dedup-key", "b"}, []string{"2 --dedup-key for 1 records"}},
		{[]string{"log", "append", "ev/p1"}, []string{"usage: holdfast log append TYPE/KEY BODY..."}},
		{[]string{"log", "read", "ev/p1", "--app-secret", "x"}, []string{"HTTP 401"}},
		{[]string{"log", "tail", "ev/p1", "--count", "1", "--timeout", "300ms", "--interval", "50ms"}, []string{"--timeout 300ms: 0 of 1 records came"}},
		{[]string{"log", "lease", "ev/p1", "c"}, []string{"no leases", "HTTP 409", "leases_disabled"}},
	} {
		cliFail(t, srv, c.args, c.wants...)
	}
}

func TestClient_LogLeases(t *testing.T) {
	srv := startClientServer(t)
	cliOK(t, srv, "log", "append", "leased/l1", "1", "2", "3", "4", "5")
	first := cliOK(t, srv, "log", "lease", "leased/l1", "c", "--limit", "2")
	lines := strings.Split(strings.TrimSpace(first), "\n")
	head := strings.Fields(lines[0])
	if len(lines) != 3 || len(head) < 7 || head[0] != "batch" || head[3] != "0-1" || head[5] != "1" || lines[1] != "0 1" || lines[2] != "1 2" {
		t.Fatalf("lease --limit 2 printed\n%s", first)
	}
	batch1 := head[1]
	second := cliJSON(t, srv, "log", "lease", "leased/l1", "c", "--limit", "2")
	batch2, _ := second["batchId"].(string)
	if second["firstOffset"] != 2.0 || second["lastOffset"] != 3.0 || len(second["records"].([]any)) != 2 || batch2 == "" {
		t.Fatalf("lease --json: %v", second)
	}
	// maxParallelism 2: nothing more until one is settled.
	cliWant(t, srv, "nothing to lease\n", "log", "lease", "leased/l1", "c")
	cliWant(t, srv, "null\n", "log", "lease", "leased/l1", "c", "--json")
	// Acking the later range commits nothing; then the earlier one commits both.
	cliWant(t, srv, "cursor unchanged\n", "log", "ack", "leased/l1", "c", batch2)
	cliFail(t, srv, []string{"log", "ack", "leased/l1", "c", batch2}, "HTTP 409", "lease_not_held")
	cliWant(t, srv, "nacked "+batch1+"\n", "log", "ack", "leased/l1", "c", batch1, "--nack")
	again := cliJSON(t, srv, "log", "lease", "leased/l1", "c")
	if again["firstOffset"] != 0.0 || again["attempt"] != 2.0 {
		t.Fatalf("lease after a nack: %v, want offsets 0-1 again at attempt 2", again)
	}
	if r := cliJSON(t, srv, "log", "ack", "leased/l1", "c", again["batchId"].(string)); r["cursor"] != 4.0 {
		t.Fatalf("ack --json: %v, want cursor 4", r)
	}
	cliWant(t, srv, "c 4\n", "log", "cursors", "leased/l1", "c")
	cliFail(t, srv, []string{"log", "ack", "leased/l1", "c", "nope"}, "not held", "HTTP 409")
	cliFail(t, srv, []string{"log", "ack", "leased/l1", "c"}, "usage: holdfast log ack TYPE/KEY CONSUMER BATCH_ID")
	cliFail(t, srv, []string{"log", "lease", "leased/l1", "c", "--limit", "0"}, "HTTP 400")
	cliWant(t, srv, "", "log", "dead-letters", "leased/l1", "c")
	if r := cliJSON(t, srv, "log", "dead-letters", "leased/l1", "c"); len(r["deadLetters"].([]any)) != 0 {
		t.Fatalf("dead-letters --json: %v", r)
	}
}
