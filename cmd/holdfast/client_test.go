package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The client tests run the holdfast binary (the test binary with
// HOLDFAST_TEST_MAIN=1) against a real server process, as a user would.

// clientTypes configures the types the client tests use: a log with leases and
// a queue whose messages fail on their first nack.
const clientTypes = "  leased:\n    log: {leases: {maxParallelism: 2, leaseDuration: 30s}}\n" +
	"  mq:\n    queue: {maxAttempts: 1}\n"

// startClientServer starts a server with the app crashAppKey/crashAppSecret.
func startClientServer(t *testing.T) *server {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a server process")
	}
	cfgFile, dataDir, _ := crashSetup(t, clientTypes)
	return startServer(t, dataDir, cfgFile)
}

// cliResult is what one run of the command did.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cliCommand returns the command `holdfast args...` pointed at srv through the
// environment (HOLDFAST_URL, HOLDFAST_APP_KEY, HOLDFAST_APP_SECRET).
func cliCommand(ctx context.Context, srv *server, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOLDFAST_") {
			env = append(env, kv)
		}
	}
	// No saved context of the user's: a test that wants one sets
	// XDG_CONFIG_HOME again (the last value wins).
	cmd.Env = append(env, "HOLDFAST_TEST_MAIN=1", "XDG_CONFIG_HOME="+filepath.Join(os.TempDir(), "holdfast-test-no-contexts"))
	if srv != nil {
		cmd.Env = append(cmd.Env, "HOLDFAST_URL="+srv.url, "HOLDFAST_APP_KEY="+crashAppKey, "HOLDFAST_APP_SECRET="+crashAppSecret)
	}
	return cmd
}

// cli runs `holdfast args...` with stdin and returns what it printed and its
// exit code.
func cli(t *testing.T, srv *server, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := cliCommand(ctx, srv, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Stdin = strings.NewReader(stdin)
	err := cmd.Run()
	var exit *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("holdfast %v: %v", args, err)
	}
	return cliResult{out.String(), errOut.String(), code}
}

// cliOK runs the command, which must succeed, and returns its stdout.
func cliOK(t *testing.T, srv *server, args ...string) string {
	t.Helper()
	r := cli(t, srv, "", args...)
	if r.code != 0 {
		t.Fatalf("holdfast %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// cliWant runs the command, which must succeed and print exactly want.
func cliWant(t *testing.T, srv *server, want string, args ...string) {
	t.Helper()
	if got := cliOK(t, srv, args...); got != want {
		t.Fatalf("holdfast %s printed\n%s\nwant\n%s", strings.Join(args, " "), got, want)
	}
}

// cliJSON runs the command with --json; it must succeed and print one JSON value.
func cliJSON(t *testing.T, srv *server, args ...string) map[string]any {
	t.Helper()
	out := cliOK(t, srv, append(args, "--json")...)
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("holdfast %s --json printed %q: %v", strings.Join(args, " "), out, err)
	}
	return v
}

// cliFail runs the command, which must exit 1 with nothing on stdout and an
// error on stderr that starts with "holdfast: " and contains every wants.
func cliFail(t *testing.T, srv *server, args []string, wants ...string) {
	t.Helper()
	r := cli(t, srv, "", args...)
	if r.code != 1 || r.stdout != "" || !strings.HasPrefix(r.stderr, "holdfast: ") {
		t.Fatalf("holdfast %s: exit %d, stdout %q, stderr %q; want exit 1 with an error", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	for _, w := range wants {
		if !strings.Contains(r.stderr, w) {
			t.Fatalf("holdfast %s: stderr %q does not mention %q", strings.Join(args, " "), r.stderr, w)
		}
	}
}

// api sends one request as another client would; it must succeed.
func api(t *testing.T, srv *server, method, path string, body any) map[string]any {
	t.Helper()
	status, reply, err := call(context.Background(), &http.Client{Timeout: 30 * time.Second}, method, srv.url+path, body)
	if err != nil || status/100 != 2 {
		t.Fatalf("%s %s: %d %v %v", method, path, status, reply, err)
	}
	return reply
}

func TestClient_Object(t *testing.T) {
	srv := startClientServer(t)
	cliWant(t, srv, "log_id 1\n", "object", "set", "order/o1", "status", `"new"`)
	cliWant(t, srv, "log_id 2\n", "object", "set", "order/o1", "note", "--string", "fragile")
	cliWant(t, srv, "log_id 3\n", "object", "patch", "order/o1", "n=5", `tags=["a","b"]`)
	if r := cliJSON(t, srv, "object", "patch", "order/o1", `{"x": true, "note": null}`); r["log_id"] != 4.0 {
		t.Fatalf("patch --json: %v", r)
	}
	cliWant(t, srv, "log_id 4\nn = 5\nstatus = \"new\"\ntags = [\"a\",\"b\"]\nx = true\n", "object", "get", "order/o1")
	st := cliJSON(t, srv, "object", "get", "order/o1")
	if st["log_id"] != 4.0 || len(st["state"].(map[string]any)) != 4 {
		t.Fatalf("get --json: %v", st)
	}
	cliWant(t, srv, `["a","b"]`+"\n", "object", "get", "order/o1", "tags")
	if r := cliJSON(t, srv, "object", "get", "order/o1", "status"); r["value"] != "new" {
		t.Fatalf("get SLOT --json: %v", r)
	}
	cliWant(t, srv, "log_id 5\n", "object", "delete", "order/o1", "x")
	cliWant(t, srv, "log_id 5\n", "object", "delete", "order/o1", "x") // missing: writes nothing
	if got := api(t, srv, "GET", "/api/v1/objects/app_crash/order/o1", nil); len(got["state"].(map[string]any)) != 3 {
		t.Fatalf("after the CLI's writes another client sees %v", got)
	}
	cliWant(t, srv, "purged order/o1\n", "object", "delete", "order/o1", "--all")
	if r := cliJSON(t, srv, "object", "get", "order/o1"); len(r["state"].(map[string]any)) != 0 {
		t.Fatalf("after the purge: %v", r)
	}
	// The App ID is not needed: the path names the app by its key.
	cliWant(t, srv, "log_id 7\n", "object", "set", "order/o1", "status", `{"code": 3}`,
		"--url", srv.url+"/", "--app-key", crashAppKey, "--app-secret", crashAppSecret)
}

// The object verbs beyond get, set, patch and delete: increment, append,
// transaction and the change log.
func TestClient_ObjectWrites(t *testing.T) {
	srv := startClientServer(t)
	cliWant(t, srv, "1 log_id 1\n", "object", "increment", "c/k", "n")
	cliWant(t, srv, "6 log_id 2\n", "object", "increment", "c/k", "n", "5")
	var r3 map[string]any // a negative BY after "--", or it reads as flags
	if out := cliOK(t, srv, "object", "increment", "--json", "c/k", "n", "--", "-2.5"); json.Unmarshal([]byte(out), &r3) != nil || r3["value"] != 3.5 || r3["log_id"] != 3.0 {
		t.Fatalf("increment --json: %s", out)
	}
	cliWant(t, srv, "log_id 4\n", "object", "append", "c/k", "tags", `"a"`)
	cliWant(t, srv, "log_id 5\n", "object", "append", "c/k", "tags", "--string", "b")
	cliWant(t, srv, "log_id 6\n", "object", "transaction", "c/k", `[{"op":"set","key":"s","value":1},{"op":"delete","key":"n"}]`)
	r := cli(t, srv, `[{"op":"increment","key":"s","by":2}]`, "object", "transaction", "c/k", "-")
	if r.code != 0 || r.stdout != "log_id 7\n" {
		t.Fatalf("transaction from stdin: %+v", r)
	}
	cliWant(t, srv, "3\n", "object", "get", "c/k", "s")
	cliWant(t, srv, "5 tags [\"a\",\"b\"]\n6 s 1\n6 n null\n7 s 3\n", "object", "log", "c/k", "--after", "4")
	cliWant(t, srv, "7 s 3\n", "object", "log", "c/k", "--after", "6", "--limit", "5")
	for _, c := range []struct {
		args  []string
		wants []string
	}{
		{[]string{"object", "increment", "c/k", "n", "two"}, []string{`BY "two" is not a number`}},
		{[]string{"object", "increment", "c/k", "tags"}, []string{"422"}},
		{[]string{"object", "transaction", "c/k", `{"op":"set"}`}, []string{"not a JSON array"}},
		{[]string{"object", "append", "c/k", "tags", "oops"}, []string{"not valid JSON"}},
	} {
		cliFail(t, srv, c.args, c.wants...)
	}
}

func TestClient_ObjectErrors(t *testing.T) {
	srv := startClientServer(t)
	cliOK(t, srv, "object", "set", "order/o1", "status", `"new"`)
	for _, c := range []struct {
		args  []string
		wants []string
	}{
		// The server's refusals: its message, status, code and request id.
		{[]string{"object", "get", "order/o1", "nope"}, []string{`slot "nope" not found`, "HTTP 404", "not_found", "request_id "}},
		{[]string{"object", "get", "order/o1", "--app-secret", "wrong"}, []string{"unauthorized", "HTTP 401"}},
		{[]string{"object", "get", "order/o1", "--app-key", "pk_other"}, []string{"unauthorized", "HTTP 401"}},
		{[]string{"object", "set", "order/o1", "log", "1"}, []string{"reserved", "HTTP 422"}},
		// Refused before any request.
		{[]string{"object", "set", "order/o1", "status", "shipped"}, []string{`VALUE "shipped" is not valid JSON`}},
		{[]string{"object", "patch", "order/o1", "{bad"}, []string{"not a JSON object"}},
		{[]string{"object", "patch", "order/o1", "novalue"}, []string{"want SLOT=VALUE"}},
		{[]string{"object", "patch", "order/o1", "a=oops"}, []string{"slot a", "not valid JSON"}},
		{[]string{"object", "get"}, []string{"usage: holdfast object get TYPE/KEY [SLOT]"}},
		{[]string{"object", "set", "order/o1", "status"}, []string{"usage: holdfast object set TYPE/KEY SLOT VALUE"}},
		{[]string{"object", "delete", "order/o1"}, []string{"--all"}},
		{[]string{"object", "delete", "order/o1", "status", "--all"}, []string{"--all"}},
		{[]string{"object", "get", "order"}, []string{"TYPE/KEY"}},
		{[]string{"object", "get", "order/o1", "--url", "ftp://x"}, []string{"--url"}},
		{[]string{"object", "get", "order/o1", "--nope"}, []string{"unknown flag"}},
		{[]string{"object", "frobnicate"}, []string{"unknown command"}},
		{[]string{"object", "gte"}, []string{`unknown command "gte" for "holdfast object"`, "Did you mean this?\n\tget"}},
		{[]string{"queue", "recieve", "jobs/q"}, []string{"Did you mean this?\n\treceive"}},
		{[]string{"cluster", "stauts"}, []string{"Did you mean this?\n\tstatus"}},
	} {
		cliFail(t, srv, c.args, c.wants...)
	}
	// With --json an error is JSON too: the server's body with its status.
	for _, c := range []struct {
		args []string
		want map[string]any
	}{
		{[]string{"object", "get", "order/o1", "nope", "--json"}, map[string]any{"status": 404.0, "code": "not_found"}},
		{[]string{"object", "get", "order", "--json"}, map[string]any{}},
	} {
		r := cli(t, srv, "", c.args...)
		var got map[string]any
		if r.code != 1 || r.stdout != "" || json.Unmarshal([]byte(r.stderr), &got) != nil || got["error"] == "" || got["error"] == nil {
			t.Fatalf("holdfast %s: exit %d, stdout %q, stderr %q; want exit 1 and a JSON error", strings.Join(c.args, " "), r.code, r.stdout, r.stderr)
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Fatalf("holdfast %s: error %v, want %s %v", strings.Join(c.args, " "), got, k, v)
			}
		}
	}
	// Nothing to connect to.
	srv.kill(t)
	cliFail(t, srv, []string{"object", "get", "order/o1"}, "connection refused")
	// No credentials at all.
	cliFail(t, nil, []string{"object", "get", "order/o1"}, "HOLDFAST_APP_KEY")
}

func TestClient_Help(t *testing.T) {
	for _, group := range []string{"object", "log", "queue", "alarm", "token", "export", "import"} {
		r := cli(t, nil, "", group, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "--app-secret") || !strings.Contains(r.stdout, "--json") {
			t.Fatalf("%s --help: exit %d\n%s%s", group, r.code, r.stdout, r.stderr)
		}
	}
	// The secret's default comes from the environment but is never printed.
	cmd := cliCommand(context.Background(), nil, "object", "--help")
	cmd.Env = append(cmd.Env, "HOLDFAST_APP_SECRET=sk_do_not_print")
	out, err := cmd.CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("sk_do_not_print")) {
		t.Fatalf("object --help: %v\n%s", err, out)
	}
}

// Shell completion offers the values of the flags that take a fixed set.
func TestClient_CompletesFlagValues(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"import", "order/o1", "--kind", ""}, "object\nlog\n"},
		{[]string{"export", "order/o1", "--kind", ""}, "object\nlog\n"},
		{[]string{"serve", "--log-format", ""}, "text\njson\n"},
		{[]string{"serve", "--log-level", ""}, "debug\ninfo\nwarn\nerror\n"},
	} {
		r := cli(t, nil, "", append([]string{"__complete"}, c.args...)...)
		if r.code != 0 || !strings.HasPrefix(r.stdout, c.want) {
			t.Fatalf("completing %v: exit %d, %q; want it to start with %q", c.args, r.code, r.stdout, c.want)
		}
	}
}

func TestClient_Token(t *testing.T) {
	srv := startClientServer(t)
	r := cli(t, srv, "", "token", "mint", "object:read:order/o1", "object:read:order/*", "--ttl", "90s")
	if r.code != 0 || strings.Count(strings.TrimSpace(r.stdout), ".") != 2 || strings.Contains(r.stdout, "\n\n") || !strings.HasPrefix(r.stderr, "expires ") {
		t.Fatalf("token mint: exit %d, stdout %q, stderr %q; want a JWT alone on stdout", r.code, r.stdout, r.stderr)
	}
	before := time.Now().UnixMilli()
	m := cliJSON(t, srv, "token", "mint", "object:read:order/o1", "--ttl", "1m")
	exp, _ := m["expires_at"].(float64)
	if tok, _ := m["token"].(string); tok == "" || exp < float64(before+50_000) || exp > float64(before+70_000) {
		t.Fatalf("token mint --json: %v", m)
	}
	cliFail(t, srv, []string{"token", "mint", "object:write:order/o1"}, "must be object:read:{type}/{key}", "HTTP 422", "invalid")
	cliFail(t, srv, []string{"token", "mint", "object:read:order/o1", "--ttl", "48h"}, "ttl_seconds", "HTTP 422")
	cliFail(t, srv, []string{"token", "mint", "object:read:order/o1", "--app-secret", "wrong"}, "HTTP 401")
	cliFail(t, srv, []string{"token", "mint"}, "usage: holdfast token mint CAPABILITY...")
}
