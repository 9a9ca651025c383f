package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browser returns the path of a Chromium, or skips the test when there is none
// and HOLDFAST_REQUIRE_BROWSER is unset (CI sets it and installs Debian's chromium).
func browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("HOLDFAST_REQUIRE_BROWSER") != "" {
		t.Fatal("no chromium binary on PATH, and HOLDFAST_REQUIRE_BROWSER is set (apt-get install chromium)")
	}
	t.Skip("skipped: no chromium binary on PATH (apt-get install chromium, or set HOLDFAST_REQUIRE_BROWSER=1 to fail instead)")
	return ""
}

// rest sends one REST request with the app's key and secret.
func rest(t *testing.T, s *Server, method, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+"/api/v1/objects/"+s.App.ID+"/order/order-42"+path, strings.NewReader(body))
	req.Header.Set("X-App-Key", s.App.Key)
	req.Header.Set("X-App-Secret", s.App.Secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s", method, path, resp.Status)
	}
}

// TestOrdersLive_Browser opens the page in a headless Chromium, waits for the
// order's initial state, changes it through REST (a PUT, then a PATCH), and
// waits for the page to show each change without a reload; then it saves a
// screenshot.
func TestOrdersLive_Browser(t *testing.T) {
	exe := browser(t)
	s, err := Start(t.TempDir(), "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Headless (in the defaults), and no sandbox: CI runs as root.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(900, 600))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	// Start the browser before anything else uses bctx: the first use allocates it.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	consoleDone := make(chan struct{})
	defer func() { cancelBrowser(); <-consoleDone }()
	go func() { // the page's console, to debug a failure
		defer close(consoleDone)
		for m, err := range chromedp.Console(bctx) {
			if err != nil {
				return
			}
			t.Logf("console: %v", m)
		}
	}()

	statusIs := func(want string) {
		t.Helper()
		expr := `document.getElementById("status").textContent === ` + `"` + want + `"`
		if _, err := chromedp.Run(bctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			text, _ := chromedp.Run(bctx, chromedp.Text("#conn"))
			t.Fatalf("the page does not show status %q (%s): %v", want, text, err)
		}
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(s.URL+"/?order=order-42")); err != nil {
		t.Fatal(err)
	}
	statusIs("placed")
	// A marker that a reload would drop.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[chromedp.Void](`window.sameLoad = true`)); err != nil {
		t.Fatal(err)
	}
	rest(t, s, "PUT", "/status", `{"value": "packed"}`)
	statusIs("packed")
	rest(t, s, "PATCH", "", `{"status": "shipped", "carrier": "DHL"}`)
	statusIs("shipped")
	same, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.sameLoad === true`))
	if err != nil || !same {
		t.Fatalf("the page was reloaded (%v)", err)
	}
	table, err := chromedp.Run(bctx, chromedp.Text("#slots"))
	if err != nil || !strings.Contains(table, `"DHL"`) || !strings.Contains(table, `["tea","mug"]`) {
		t.Fatalf("slots table %q: want the carrier and the items (%v)", table, err)
	}

	png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("HOLDFAST_ARTIFACTS_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "orders-live.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// TestOrdersLive_VendoredPhoenix: the vendored client is the one the phoenix
// suite pins (jstest/package.json), when jstest's node_modules are installed.
func TestOrdersLive_VendoredPhoenix(t *testing.T) {
	upstream, err := os.ReadFile("../../jstest/node_modules/phoenix/priv/static/phoenix.mjs")
	if err != nil {
		t.Skip("jstest/node_modules is not installed (cd jstest && npm ci)")
	}
	ours, err := static.ReadFile("static/phoenix.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if _, body, ok := bytes.Cut(ours, []byte(" */\n")); !ok || !bytes.Equal(body, upstream) {
		t.Fatal("static/phoenix.mjs differs from jstest's phoenix: copy it again with its header (README.md)")
	}
}
