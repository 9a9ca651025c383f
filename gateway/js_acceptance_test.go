package gateway

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

// TestPhoenixJSAcceptance runs jstest/acceptance.mjs, which drives the official
// phoenix JavaScript client (with ws, on Node 20) against this server on
// 127.0.0.1. It installs the suite's npm packages (npm ci) on first use.
func TestPhoenixJSAcceptance(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node (20 or later) is needed for the phoenix client suite: apt-get install nodejs npm")
	}
	dir, err := filepath.Abs("../jstest")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "phoenix")); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	ts := newTestServer(t, cluster.Config{TypeOptions: func(typ string) actors.TypeOptions {
		if typ == "short" {
			return actors.TypeOptions{ChangeLogEntries: 3}
		}
		return actors.DefaultTypeOptions()
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "acceptance.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"HOLDFAST_URL="+ts.url,
		"HOLDFAST_APP_ID="+testApp.ID,
		"HOLDFAST_APP_KEY="+testApp.Key,
		"HOLDFAST_APP_SECRET="+testApp.Secret,
	)
	out, err := cmd.CombinedOutput()
	t.Logf("phoenix client suite:\n%s", out)
	if err != nil {
		t.Fatalf("the phoenix client suite failed: %v", err)
	}
	if !strings.Contains(string(out), " passed, 0 failed") {
		t.Fatal("the suite did not report its result")
	}
}
