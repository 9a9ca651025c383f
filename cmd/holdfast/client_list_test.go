package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestClient_List: object ls, log ls and queue ls against a real server
// (256 partitions): every key in byte order, paged through (more keys than
// one page of the server's), --prefix, --after, --limit with the next key
// in --json; log consumers with cursors and backlogs; a TYPE/KEY where a
// type is wanted is an error that says so.
func TestClient_List(t *testing.T) {
	srv := startClientServer(t)
	var want string
	for i := range 1005 {
		key := "o" + itoa4(i)
		api(t, srv, "PUT", "/api/v1/objects/app_crash/order/"+key+"/n", map[string]any{"value": i})
		want += key + "\n"
	}
	cliWant(t, srv, want, "object", "ls", "order")
	cliWant(t, srv, "o1000\no1001\no1002\no1003\no1004\n", "object", "ls", "order", "--prefix", "o100")
	cliWant(t, srv, "o1003\no1004\n", "object", "ls", "order", "--after", "o1002")
	cliWant(t, srv, "o0000\no0001\n", "object", "ls", "order", "--limit", "2")
	if r := cliJSON(t, srv, "object", "ls", "order", "--limit", "2"); len(r["keys"].([]any)) != 2 || r["next"] != "o0001" {
		t.Fatalf("object ls --limit 2 --json: %v", r)
	}
	if r := cliJSON(t, srv, "object", "ls", "order", "--prefix", "o100"); len(r["keys"].([]any)) != 5 || r["next"] != nil {
		t.Fatalf("object ls --prefix o100 --json: %v", r)
	}
	cliWant(t, srv, "", "object", "ls", "nothing")

	api(t, srv, "POST", "/api/v1/logs/app_crash/ev/p1/append", map[string]any{"records": []map[string]any{{"body": 1}, {"body": 2}, {"body": 3}}})
	api(t, srv, "POST", "/api/v1/queues/app_crash/jobs/q1/messages", map[string]any{"messages": []map[string]any{{"id": "m1", "payload": 1}}})
	cliWant(t, srv, "p1\n", "log", "ls", "ev")
	cliWant(t, srv, "", "log", "ls", "order")
	cliWant(t, srv, "q1\n", "queue", "ls", "jobs")
	cliWant(t, srv, "p1\n", "object", "ls", "ev")
	// Without a TYPE: the app's types.
	cliWant(t, srv, "ev\njobs\norder\n", "object", "ls")
	cliWant(t, srv, "ev\n", "object", "ls", "--limit", "1")
	if r := cliJSON(t, srv, "object", "ls", "--prefix", "o"); len(r["types"].([]any)) != 1 || r["next"] != nil {
		t.Fatalf("object ls --prefix o --json: %v", r)
	}
	cliFail(t, srv, []string{"log", "ls"}, "usage")

	cliOK(t, srv, "log", "cursors", "ev/p1", "billing", "2")
	cliOK(t, srv, "log", "cursors", "ev/p1", "audit", "0")
	cliWant(t, srv, "CONSUMER  CURSOR  BACKLOG\naudit     0       3\nbilling   2       1\n", "log", "consumers", "ev/p1")
	if r := cliJSON(t, srv, "log", "consumers", "ev/p1"); r["nextOffset"] != 3.0 || len(r["consumers"].([]any)) != 2 {
		t.Fatalf("log consumers --json: %v", r)
	}
	if r := cli(t, srv, "", "log", "consumers", "ev/none"); r.code != 0 || r.stdout != "" || r.stderr == "" {
		t.Fatalf("log consumers of a log without any: %+v", r)
	}
	cliFail(t, srv, []string{"object", "ls", "order/o1"}, "name a type")
	cliFail(t, srv, []string{"object", "ls", "order", "--limit", "-1"}, "--limit")
	cliFail(t, srv, []string{"object", "ls", "a:b"}, "type must not contain")

	// Shell completion of TYPE/KEY and TYPE arguments, from the server:
	// types (with a "/" and no space after it), then the type's keys of
	// the group's listing.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"object", "get", ""}, "ev/\njobs/\norder/\n:6\n"},
		{[]string{"object", "get", "o"}, "order/\n:6\n"},
		{[]string{"object", "set", "order/o100"}, "order/o1000\norder/o1001\norder/o1002\norder/o1003\norder/o1004\n:4\n"},
		{[]string{"log", "read", "ev/"}, "ev/p1\n:4\n"},
		{[]string{"log", "read", "order/"}, ":4\n"}, // no order object holds a log
		{[]string{"queue", "receive", "jobs/"}, "jobs/q1\n:4\n"},
		{[]string{"object", "ls", "e"}, "ev\n:4\n"},
		{[]string{"object", "get", "order/o1", ""}, ":4\n"}, // the slot: nothing offered
	} {
		r := cli(t, srv, "", append([]string{"__complete"}, c.args...)...)
		if got, _, _ := strings.Cut(r.stdout, "Completion ended"); r.code != 0 || got != c.want {
			t.Fatalf("completing %q: exit %d, %q; want %q", c.args, r.code, r.stdout, c.want)
		}
	}
	// With no server to ask: nothing, and no error.
	if r := cli(t, nil, "", "__complete", "object", "get", ""); r.code != 0 || !strings.HasPrefix(r.stdout, ":4\n") {
		t.Fatalf("completing with no credentials: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}

func itoa4(i int) string { return fmt.Sprintf("%04d", i) }
