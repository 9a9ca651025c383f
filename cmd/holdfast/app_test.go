package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestApp_FirstStartAndShow: the first start on a data directory whose
// configuration lists no apps creates one and prints its credentials; later
// starts print nothing and say they serve the directory's apps; holdfast app
// show prints them again, from the node's files.
func TestApp_FirstStartAndShow(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := func() (*server, *bytes.Buffer) {
		var out bytes.Buffer
		cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--config", empty)
		cmd.Stdout = &out
		return startServerCmd(t, cmd), &out
	}
	srv, out := start()
	srv.kill(t)
	var id, key, secret string
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "App" {
			switch f[1] {
			case "ID:":
				id = f[2]
			case "Key:":
				key = f[2]
			case "Secret:":
				secret = f[2]
			}
		}
	}
	if !strings.HasPrefix(id, "app_") || !strings.HasPrefix(key, "pk_") || !strings.HasPrefix(secret, "sk_") {
		t.Fatalf("the first start printed %q", out.String())
	}
	// The hint names the data directory, not the default one.
	if !strings.Contains(out.String(), "holdfast app show --data-dir "+data+" prints it again") {
		t.Fatalf("the first start's hint: %q", out.String())
	}
	srv, out = start()
	srv.kill(t)
	if out.Len() != 0 || !strings.Contains(srv.log(), "serving those of the data directory") {
		t.Fatalf("a later start printed %q; logged\n%s", out.String(), srv.log())
	}
	show := cliOK(t, nil, "app", "show", "--data-dir", data)
	if show != "from "+filepath.Join(data, "apps.json")+":\n  App ID:     "+id+"\n  App Key:    "+key+"\n  App Secret: "+secret+"\n" {
		t.Fatalf("app show printed %q", show)
	}
	var apps []map[string]string
	if err := json.Unmarshal([]byte(cliOK(t, nil, "app", "show", "--data-dir", data, "--json")), &apps); err != nil ||
		len(apps) != 1 || apps[0]["secret"] != secret {
		t.Fatalf("app show --json: %v %v", apps, err)
	}
	cliFail(t, nil, []string{"app", "show", "--data-dir", filepath.Join(dir, "none")}, "does not exist")
}

// TestApp_AFailedStartLeavesNoApp: a start that fails (a partition count
// that is not the data directory's) creates no apps file.
func TestApp_AFailedStartLeavesNoApp(t *testing.T) {
	cfgFile, data, _ := crashSetup(t, "") // its configuration lists an app: no apps file
	srv := startServer(t, data, cfgFile)
	srv.kill(t)
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", data, "--listen", "127.0.0.1:0", "--config", empty, "--partitions", "16")
	cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "partition") {
		t.Fatalf("serve --partitions 16 on another count's directory: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(data, "apps.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the failed start left an apps file behind (%v)\n%s", err, out)
	}
}
