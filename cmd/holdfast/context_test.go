package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestContexts: a saved context gives the client commands a node and an
// app's credentials; flags, the environment and --context win over the
// current context; the file is the user's only and lists no secret.
func TestContexts(t *testing.T) {
	srv := startClientServer(t)
	home := t.TempDir()
	run := func(env []string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := cliCommand(ctx, nil, args...)
		cmd.Env = append(append(cmd.Env, "XDG_CONFIG_HOME="+home), env...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if err != nil {
			code = cmd.ProcessState.ExitCode()
		}
		return out.String(), errOut.String(), code
	}
	want := func(env []string, stdout string, args ...string) {
		t.Helper()
		if out, errOut, code := run(env, args...); code != 0 || out != stdout {
			t.Fatalf("holdfast %s: exit %d, %q %q; want %q", strings.Join(args, " "), code, out, errOut, stdout)
		}
	}
	fails := func(env []string, stderr string, args ...string) {
		t.Helper()
		if out, errOut, code := run(env, args...); code != 1 || !strings.Contains(errOut, stderr) {
			t.Fatalf("holdfast %s: exit %d, %q %q; want an error with %q", strings.Join(args, " "), code, out, errOut, stderr)
		}
	}
	fails(nil, "no app credentials", "object", "get", "order/c1")
	want(nil, "saved context local (current)\n", "context", "add", "local", "--url", srv.url, "--app-key", crashAppKey, "--app-secret", crashAppSecret)
	want(nil, "log_id 1\n", "object", "set", "order/c1", "x", "1")
	path := filepath.Join(home, "holdfast", "contexts.json")
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("contexts.json: %v %v, want mode 0600", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("the contexts' directory: %v %v, want mode 0700", st.Mode(), err)
	}
	fails(nil, "want http://host:port", "context", "add", "bad", "--url", "ftp://x")
	want(nil, "saved context other\n", "context", "add", "other", "--url", "http://127.0.0.1:1", "--app-key", crashAppKey, "--app-secret", crashAppSecret)
	fails(nil, "connection refused", "object", "get", "order/c1", "--context", "other")
	fails([]string{"HOLDFAST_CONTEXT=other"}, "connection refused", "object", "get", "order/c1")
	fails(nil, `no context "nope"`, "object", "get", "order/c1", "--context", "nope")
	want(nil, "using context other\n", "context", "use", "other")
	fails(nil, "connection refused", "object", "get", "order/c1", "x")
	want(nil, "1\n", "object", "get", "order/c1", "x", "--url", srv.url)               // a flag wins
	want([]string{"HOLDFAST_URL=" + srv.url}, "1\n", "object", "get", "order/c1", "x") // so does the environment
	out, _, _ := run(nil, "context", "ls")
	if out != "  local "+srv.url+" "+crashAppKey+"\n* other http://127.0.0.1:1 "+crashAppKey+"\n" || strings.Contains(out, crashAppSecret) {
		t.Fatalf("context ls printed %q", out)
	}
	if out, _, _ := run(nil, "__complete", "context", "use", ""); !strings.HasPrefix(out, "local\nother\n") {
		t.Fatalf("completing a context: %q", out)
	}
	want(nil, "deleted context other\n", "context", "rm", "other")
	fails(nil, "no app credentials", "object", "get", "order/c1") // no current context any more
	want(nil, "using context local\n", "context", "use", "local")
	want(nil, "1\n", "object", "get", "order/c1", "x")
	fails(nil, `no context "gone"`, "context", "use", "gone")
}
