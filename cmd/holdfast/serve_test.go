package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestServe_SIGTERMFinishesInflightWritesAndExitsZero sends SIGTERM while writers
// are busy: the server must exit 0, and every write it acknowledged must be there
// after a restart.
func TestServe_SIGTERMFinishesInflightWritesAndExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "holdfast.yaml")
	cfg := fmt.Sprintf("apps:\n  - {id: app_crash, key: %s, secret: %s}\n", crashAppKey, crashAppSecret)
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	srv := startServer(t, dataDir, cfgFile)
	client := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	var mu sync.Mutex
	acked := map[string]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				slot := fmt.Sprintf("w%d-%d", w, i)
				status, _, err := call(ctx, client, "PUT", srv.url+"/api/v1/objects/app_crash/term/o"+fmt.Sprint(w%4)+"/"+slot, map[string]any{"value": i})
				if err != nil || status != http.StatusOK {
					return // refused or cut off by the shutdown: outcome unknown
				}
				mu.Lock()
				acked[fmt.Sprintf("o%d/%s", w%4, slot)] = true
				mu.Unlock()
			}
		}(w)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := <-srv.exited
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("server exit after SIGTERM: %v\n%s", err, srv.log())
	}
	if !strings.Contains(srv.log(), "stopped") {
		t.Fatalf("no orderly shutdown in the log:\n%s", srv.log())
	}
	srv = startServer(t, dataDir, cfgFile)
	defer srv.kill(t)
	for key := range acked {
		obj, slot, _ := strings.Cut(key, "/")
		status, reply, err := call(ctx, client, "GET", srv.url+"/api/v1/objects/app_crash/term/"+obj+"/"+slot, nil)
		if err != nil || status != http.StatusOK || reply["value"] == nil {
			t.Fatalf("acknowledged %s after SIGTERM and restart: %d %v %v", key, status, reply, err)
		}
	}
}

func TestVersion(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "version")
	cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "holdfast ") {
		t.Fatalf("version printed %q", out.String())
	}
}

func TestServe_BadConfigurationStopsStartUp(t *testing.T) {
	for _, c := range []struct{ name, yaml, mention string }{
		{"unknown key", "listen: 127.0.0.1:0\nnoSuchKey: 1\n", "noSuchKey"},
		{"log maxBytes above 1 GiB", "listen: 127.0.0.1:0\ntypes:\n  events:\n    log:\n      retention: {maxBytes: 1073741825}\n", "maxBytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfgFile := filepath.Join(dir, "bad.yaml")
			if err := os.WriteFile(cfgFile, []byte(c.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", filepath.Join(dir, "data"), "--config", cfgFile)
			cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("serve started:\n%s", out)
			}
			if !strings.Contains(string(out), c.mention) {
				t.Fatalf("error does not name %s:\n%s", c.mention, out)
			}
		})
	}
}

// TestServe_LogFormats: --log-format json writes JSON lines (the start-up line
// among them); a bad format or level stops start-up, naming the flag.
func TestServe_LogFormats(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--", "serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--log-format", "json")
	cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stderr)
	found := false
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("not a JSON line: %s", sc.Text())
		}
		if line["msg"] == "holdfast listening" && line["addr"] != nil && line["level"] == "INFO" {
			found = true
			break
		}
	}
	if !found {
		t.Fatal("no JSON start-up line")
	}
	for _, args := range [][]string{{"--log-format", "xml"}, {"--log-level", "loud"}} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--", "serve", "--data-dir", filepath.Join(dir, "d2"), "--listen", "127.0.0.1:0"}, args...)...)
		cmd.Env = append(os.Environ(), "HOLDFAST_TEST_MAIN=1")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), args[0]) {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
}
