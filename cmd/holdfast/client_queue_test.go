package main

import (
	"strings"
	"testing"
	"time"
)

// receiveOne receives one message of q with --json and returns it.
func receiveOne(t *testing.T, srv *server, q string) map[string]any {
	t.Helper()
	r := cliJSON(t, srv, "queue", "receive", q, "--max", "1", "--wait", "5s")
	msgs := r["messages"].([]any)
	if len(msgs) != 1 {
		t.Fatalf("queue receive %s: %v, want one message", q, r)
	}
	return msgs[0].(map[string]any)
}

func TestClient_Queue(t *testing.T) {
	srv := startClientServer(t)
	out := cliOK(t, srv, "queue", "send", "mq/q1", `{"to":"ann"}`, `{"to":"bob"}`, "--id", "m1", "--topic", "welcome")
	ids := strings.Fields(out)
	if len(ids) != 3 || ids[0] != "ids" || ids[1] != "m1" || ids[2] == "" {
		t.Fatalf("queue send printed %q", out)
	}
	// Re-sending a held id writes nothing.
	if r := cliJSON(t, srv, "queue", "send", "mq/q1", `"dup"`, "--id", "m1"); r["ids"].([]any)[0] != "m1" {
		t.Fatalf("send --json: %v", r)
	}
	cliWant(t, srv, "pending 2\ndelayed 0\nprocessing 0\ncomplete 0\nfailed 0\n", "queue", "stats", "mq/q1")

	// Human receive: "ID TOPIC attempt N receipt RECEIPT PAYLOAD".
	line := strings.Fields(cliOK(t, srv, "queue", "receive", "mq/q1", "--max", "1"))
	if len(line) != 7 || line[0] != "m1" || line[1] != "welcome" || line[3] != "1" || line[6] != `{"to":"ann"}` {
		t.Fatalf("queue receive printed %v", line)
	}
	cliWant(t, srv, "acked 1\n", "queue", "ack", "mq/q1", line[5])
	cliFail(t, srv, []string{"queue", "ack", "mq/q1", line[5]}, "not held", "HTTP 409", "lease_not_held")

	// maxAttempts 1: a nack fails the message into the dead letters.
	m := receiveOne(t, srv, "mq/q1")
	cliWant(t, srv, "failed\n", "queue", "nack", "mq/q1", m["receipt"].(string), "--error", "smtp down")
	cliOK(t, srv, "queue", "send", "mq/q1", `"y"`, "--id", "m3")
	m3 := receiveOne(t, srv, "mq/q1")
	cliWant(t, srv, "failed\n", "queue", "nack", "mq/q1", m3["receipt"].(string), "--dead", "--error", "bad address")
	dl := cliOK(t, srv, "queue", "dead-letters", "mq/q1")
	if !strings.Contains(dl, ids[2]+" default welcome attempts 1 exhausted: smtp down {\"to\":\"bob\"}\n") ||
		!strings.Contains(dl, "m3 default default attempts") || !strings.Contains(dl, "rejected: bad address") {
		t.Fatalf("dead-letters printed\n%s", dl)
	}
	if r := cliJSON(t, srv, "queue", "dead-letters", "mq/q1", "--limit", "1"); len(r["deadLetters"].([]any)) != 1 {
		t.Fatalf("dead-letters --limit 1 --json: %v", r)
	}
	cliWant(t, srv, "redriven 1\n", "queue", "redrive", "mq/q1", "m3")
	cliWant(t, srv, "pending 1\ndelayed 0\nprocessing 0\ncomplete 1\nfailed 1\n", "queue", "stats", "mq/q1")
	if r := cliJSON(t, srv, "queue", "redrive", "mq/q1"); r["redriven"] != 1.0 {
		t.Fatalf("redrive --json: %v", r)
	}
	if r := cliJSON(t, srv, "queue", "stats", "mq/q1"); r["pending"] != 2.0 || r["failed"] != 0.0 {
		t.Fatalf("stats --json: %v", r)
	}
	// A nack of a live message with a delay keeps it pending; --delay sets when.
	cliOK(t, srv, "queue", "send", "other/q", `1`, "--id", "n1")
	n1 := receiveOne(t, srv, "other/q")
	cliWant(t, srv, "pending\n", "queue", "nack", "other/q", n1["receipt"].(string), "--delay", "1h")
	if r := cliJSON(t, srv, "queue", "stats", "other/q"); r["delayed"] != 1.0 {
		t.Fatalf("stats after a nack --delay 1h: %v", r)
	}
	if r := cliJSON(t, srv, "queue", "receive", "other/q", "--wait", "100ms"); len(r["messages"].([]any)) != 0 {
		t.Fatalf("receive of a delayed message: %v", r)
	}
	cliWant(t, srv, "no message is due\n", "queue", "receive", "other/q")
	// A dead letter deleted for good.
	cliOK(t, srv, "queue", "send", "mq/q9", `"z"`, "--id", "m9")
	m9 := receiveOne(t, srv, "mq/q9")
	cliWant(t, srv, "failed\n", "queue", "nack", "mq/q9", m9["receipt"].(string), "--dead", "--error", "no")
	cliWant(t, srv, "deleted m9\n", "queue", "dead-letter-delete", "mq/q9", "m9")
	cliWant(t, srv, "", "queue", "dead-letters", "mq/q9")
	cliFail(t, srv, []string{"queue", "dead-letter-delete", "mq/q9", "m9"}, "dead letter m9", "404")

	for _, c := range []struct {
		args  []string
		wants []string
	}{
		{[]string{"queue", "receive", "mq/q1", "--max", "0"}, []string{"max must be at least 1", "HTTP 400"}},
		{[]string{"queue", "receive", "mq/q1", "--wait", "30s"}, []string{"waitMs", "HTTP 400"}},
		{[]string{"queue", "nack", "mq/q1", "bogus"}, []string{"HTTP 409"}},
		{[]string{"queue", "nack", "mq/q1", "bogus", "--dead"}, []string{"HTTP 409"}},
		{[]string{"queue", "send", "mq/q1", "oops"}, []string{"PAYLOAD", "not valid JSON"}},
		{[]string{"queue", "send", "mq/q1", "1", "--id", ""}, []string{"HTTP 422", "invalid"}},
		{[]string{"queue", "send", "mq/q1"}, []string{"usage: holdfast queue send TYPE/KEY PAYLOAD..."}},
		{[]string{"queue", "ack", "mq/q1"}, []string{"usage: holdfast queue ack TYPE/KEY RECEIPT..."}},
		{[]string{"queue", "stats", "mq/q1", "--app-secret", "x"}, []string{"HTTP 401"}},
		{[]string{"queue", "dead-letters", "mq/q1", "--limit", "0"}, []string{"HTTP 400"}},
	} {
		cliFail(t, srv, c.args, c.wants...)
	}
}

func TestClient_Alarm(t *testing.T) {
	srv := startClientServer(t)
	out := cliOK(t, srv, "alarm", "set", "jobs/j1", "compact", "--in", "1h", "--action", `{"kind":"trim"}`)
	if !strings.HasPrefix(out, "compact at ") || !strings.HasSuffix(out, " generation 1\n") {
		t.Fatalf("alarm set printed %q", out)
	}
	r := cliJSON(t, srv, "alarm", "set", "jobs/j1", "later", "--at", "2031-01-01T00:00:00Z", "--action", `{"kind":"enqueue","topic":"t","payload":1}`)
	if r["name"] != "later" || r["at"] != 1924992000000.0 {
		t.Fatalf("alarm set --json: %v", r)
	}
	cliOK(t, srv, "alarm", "set", "jobs/j1", "ms", "--at", "1924992000001", "--action", `{"kind":"trim"}`)
	cliWant(t, srv, "later pending at 2031-01-01T00:00:00Z attempt 0 action {\"kind\":\"enqueue\",\"topic\":\"t\",\"payload\":1}\n", "alarm", "get", "jobs/j1", "later")
	if g := cliJSON(t, srv, "alarm", "get", "jobs/j1", "compact"); g["status"] != "pending" || g["idempotencyKey"] == "" {
		t.Fatalf("alarm get --json: %v", g)
	}
	list := strings.Split(strings.TrimSpace(cliOK(t, srv, "alarm", "list", "jobs/j1")), "\n")
	if len(list) != 3 || !strings.HasPrefix(list[0], "compact ") || !strings.HasPrefix(list[1], "later ") || !strings.HasPrefix(list[2], "ms ") {
		t.Fatalf("alarm list printed %q, want compact, later, ms by time", list)
	}
	cliWant(t, srv, "deleted compact\n", "alarm", "delete", "jobs/j1", "compact")
	if l := cliJSON(t, srv, "alarm", "list", "jobs/j1"); len(l["alarms"].([]any)) != 2 {
		t.Fatalf("alarm list --json after a delete: %v", l)
	}
	// An alarm that fires: it enqueues onto the object's queue.
	cliOK(t, srv, "alarm", "set", "jobs/j2", "now", "--in", "1ms", "--action", `{"kind":"enqueue","topic":"fired","payload":"hi"}`)
	if m := receiveOne(t, srv, "jobs/j2"); m["topic"] != "fired" || m["payload"] != "hi" {
		t.Fatalf("the alarm enqueued %v", m)
	}
	deadline := time.Now().Add(10 * time.Second)
	for cli(t, srv, "", "alarm", "get", "jobs/j2", "now").code == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the fired alarm is still listed")
		}
		time.Sleep(20 * time.Millisecond)
	}

	for _, c := range []struct {
		args  []string
		wants []string
	}{
		{[]string{"alarm", "get", "jobs/j1", "compact"}, []string{`no alarm "compact"`, "HTTP 404", "not_found"}},
		{[]string{"alarm", "delete", "jobs/j1", "compact"}, []string{"HTTP 404"}},
		{[]string{"alarm", "set", "jobs/j1", "x", "--in", "1h", "--action", `{"kind":"nope"}`}, []string{"nope", "HTTP 422", "invalid"}},
		{[]string{"alarm", "set", "jobs/j1", "x", "--in", "1h", "--action", `{kind`}, []string{"--action", "not valid JSON"}},
		{[]string{"alarm", "set", "jobs/j1", "x", "--action", `{"kind":"trim"}`}, []string{"give --at or --in"}},
		{[]string{"alarm", "set", "jobs/j1", "x", "--in", "1h", "--at", "1", "--action", `{"kind":"trim"}`}, []string{"give --at or --in"}},
		{[]string{"alarm", "set", "jobs/j1", "x", "--at", "tomorrow", "--action", `{"kind":"trim"}`}, []string{"--at", "RFC 3339"}},
		{[]string{"alarm", "get", "jobs/j1"}, []string{"usage: holdfast alarm get TYPE/KEY NAME"}},
		{[]string{"alarm", "list", "jobs/j1", "--app-secret", "x"}, []string{"HTTP 401"}},
	} {
		cliFail(t, srv, c.args, c.wants...)
	}
}
