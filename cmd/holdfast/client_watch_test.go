package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// watchProc is a running `holdfast object watch`, read line by line.
type watchProc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *lockedBuffer
}

func startWatch(t *testing.T, ctx context.Context, srv *server, args ...string) *watchProc {
	t.Helper()
	w := &watchProc{cmd: cliCommand(ctx, srv, append([]string{"object", "watch"}, args...)...), lines: make(chan string, 100), stderr: &lockedBuffer{}}
	w.cmd.Stderr = w.stderr
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	return w
}

// next returns the next line watch printed, failing after 20s or at its exit.
func (w *watchProc) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			t.Fatalf("watch exited early: %v\nstderr: %s", w.cmd.Wait(), w.stderr)
		}
		return l
	case <-time.After(20 * time.Second):
		t.Fatalf("watch printed nothing for 20s; stderr: %s", w.stderr)
	}
	return ""
}

// wait waits for watch to exit, which it must do with status 0 and no more output.
func (w *watchProc) wait(t *testing.T) {
	t.Helper()
	if l, ok := <-w.lines; ok {
		t.Fatalf("watch printed %q after its --count changes", l)
	}
	if err := w.cmd.Wait(); err != nil {
		t.Fatalf("watch: %v\nstderr: %s", err, w.stderr)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestClient_Watch runs two watchers (text and --json) while another client
// writes: each prints the snapshot, then the three changes, then exits.
func TestClient_Watch(t *testing.T) {
	srv := startClientServer(t)
	const obj = "/api/v1/objects/app_crash/order/o1"
	api(t, srv, "PUT", obj+"/status", map[string]any{"value": "new"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	text := startWatch(t, ctx, srv, "order/o1", "--count", "3", "--timeout", "50s")
	js := startWatch(t, ctx, srv, "order/o1", "--count", "3", "--timeout", "50s", "--json")
	for _, want := range []string{"snapshot log_id 1", `  status = "new"`} {
		if got := text.next(t); got != want {
			t.Fatalf("watch printed %q, want %q", got, want)
		}
	}
	if got := js.next(t); got != `{"event":"snapshot","payload":{"state":{"status":"new"},"log_id":1}}` {
		t.Fatalf("watch --json printed %q, want the snapshot", got)
	}
	// Both joined (they printed their snapshots): the next writes are live.
	api(t, srv, "POST", obj+"/events", map[string]any{"event": "run:start", "payload": map[string]any{}}) // not a change
	api(t, srv, "PUT", obj+"/status", map[string]any{"value": "shipped"})
	api(t, srv, "PATCH", obj, map[string]any{"n": 1, "note": "fragile\nglass"})
	api(t, srv, "DELETE", obj+"/status", nil)
	for _, want := range []string{`2 status = "shipped"`, `3 n = 1, note = "fragile\nglass"`, `4 status deleted`} {
		if got := text.next(t); got != want {
			t.Fatalf("watch printed %q, want %q", got, want)
		}
	}
	text.wait(t)
	for _, want := range []string{
		`{"event":"change","payload":{"key":"status","value":"shipped","previous":"new","log_id":2}}`,
		`{"event":"batch","payload":{"changes":[{"key":"n","value":1,"previous":null},{"key":"note","value":"fragile\nglass","previous":null}],"log_id":3}}`,
		`{"event":"change","payload":{"key":"status","value":null,"previous":"shipped","log_id":4}}`,
	} {
		got := js.next(t)
		if !json.Valid([]byte(got)) || got != want {
			t.Fatalf("watch --json printed %q, want %q", got, want)
		}
	}
	js.wait(t)

	cliFail(t, srv, []string{"object", "watch", "order/o1", "--app-secret", "wrong"}, "refused: invalid app_secret")
	cliFail(t, srv, []string{"object", "watch", "order/o1", "--app-key", "pk_nope"}, "unknown app_key", "HTTP 403")
	if r := cli(t, srv, "", "object", "watch", "order/o1", "--count", "1", "--timeout", "300ms"); r.code != 1 ||
		!strings.HasPrefix(r.stdout, "snapshot log_id 4\n") || r.stderr != "holdfast: --timeout 300ms: 0 of 1 changes came\n" {
		t.Fatalf("watch --count 1 without changes: %+v", r)
	}
	cliFail(t, srv, []string{"object", "watch"}, "usage: holdfast object watch TYPE/KEY")
	// With only --timeout, watching ends quietly after the snapshot.
	cliWant(t, srv, "snapshot log_id 4\n  n = 1\n  note = \"fragile\\nglass\"\n", "object", "watch", "order/o1", "--timeout", "300ms")
}

// TestClient_WatchResumesAfterRestart kills the server under a watcher: it
// reconnects once the server is back and prints every change exactly once.
func TestClient_WatchResumesAfterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	cfgFile, dataDir, _ := crashSetup(t, "")
	addr := freeAddr(t)
	srv := startServerOn(t, dataDir, cfgFile, addr)
	const obj = "/api/v1/objects/app_crash/order/o1"
	api(t, srv, "PUT", obj+"/a", map[string]any{"value": 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := startWatch(t, ctx, srv, "order/o1", "--count", "3", "--timeout", "50s")
	for _, want := range []string{"snapshot log_id 1", "  a = 1"} {
		if got := w.next(t); got != want {
			t.Fatalf("watch printed %q, want %q", got, want)
		}
	}
	api(t, srv, "PUT", obj+"/a", map[string]any{"value": 2})
	if got := w.next(t); got != "2 a = 2" {
		t.Fatalf("watch printed %q", got)
	}
	srv.kill(t)
	srv = startServerOn(t, dataDir, cfgFile, addr)
	api(t, srv, "PUT", obj+"/a", map[string]any{"value": 3})
	api(t, srv, "PUT", obj+"/b", map[string]any{"value": true})
	for _, want := range []string{"3 a = 3", "4 b = true"} {
		if got := w.next(t); got != want {
			t.Fatalf("after the restart watch printed %q, want %q", got, want)
		}
	}
	w.wait(t)
	// One line when the feed was lost, one when it was back, however many
	// attempts failed in between, and no Go error chains (issue 26).
	if got, want := w.stderr.String(), "holdfast: watch: the connection was lost; reconnecting\n"+
		"holdfast: watch: reconnected; resuming after log_id 2\n"; got != want {
		t.Fatalf("watch's stderr %q, want %q", got, want)
	}
}

// startServerOn is startServer on a fixed address, so that a restarted server
// is where its clients left it.
func startServerOn(t *testing.T, dataDir, configFile, addr string) *server {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", dataDir, "--listen", addr, "--config", configFile)
	cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, url: "http://" + addr, stderr: &bytes.Buffer{}, exited: make(chan error, 1)}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if listenRE.MatchString(sc.Text()) {
				close(listening)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		s.exited <- cmd.Wait()
	}()
	select {
	case <-listening:
	case err := <-s.exited:
		t.Fatalf("server on %s exited at start: %v", addr, err)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("server on %s did not start", addr)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-s.exited
		}
	})
	return s
}
