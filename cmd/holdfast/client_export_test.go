package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestClient_ExportImportObject(t *testing.T) {
	srv := startClientServer(t)
	api(t, srv, "PATCH", "/api/v1/objects/app_crash/order/src", map[string]any{
		"status": "shipped", "n": 42, "ratio": 0.5, "ok": true,
		"note":  "two\nlines, \"quoted\", ünïcode",
		"items": []any{map[string]any{"sku": "a", "qty": 2}, nil, []any{}},
	})
	file := filepath.Join(t.TempDir(), "src.jsonl")
	cliWant(t, srv, "exported 6 slots to "+file+"\n", "export", "order/src", "--kind", "object", "--out", file)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 6 || lines[0] != `{"key":"items","value":[{"qty":2,"sku":"a"},null,[]]}` {
		t.Fatalf("export wrote\n%s", b)
	}
	// Into another object from the file, and from stdin.
	cliWant(t, srv, "imported 6 slots into order/copy (log_id 1)\n", "import", "order/copy", "--kind", "object", "--in", file)
	if r := cli(t, srv, string(b), "import", "order/copy2", "--kind", "object", "--json"); r.code != 0 || r.stdout != `{"imported":6,"kind":"object","log_id":1}`+"\n" {
		t.Fatalf("import from stdin --json: %+v", r)
	}
	src := api(t, srv, "GET", "/api/v1/objects/app_crash/order/src", nil)["state"]
	for _, o := range []string{"copy", "copy2"} {
		if got := api(t, srv, "GET", "/api/v1/objects/app_crash/order/"+o, nil)["state"]; !reflect.DeepEqual(got, src) {
			t.Fatalf("order/%s after the import: %v\nwant %v", o, got, src)
		}
	}
	// Export to stdout is the same lines; an empty object exports nothing.
	cliWant(t, srv, string(b), "export", "order/src", "--kind", "object")
	cliWant(t, srv, "", "export", "order/empty", "--kind", "object")
	if r := cliJSON(t, srv, "export", "order/src", "--kind", "object", "--out", file); r["exported"] != 6.0 {
		t.Fatalf("export --json: %v", r)
	}

	for _, c := range []struct {
		args  []string
		wants []string
	}{
		{[]string{"export", "order/src"}, []string{`--kind ""`, "want object or log"}},
		{[]string{"import", "order/x", "--kind", "slots"}, []string{"want object or log"}},
		{[]string{"export", "order/src", "--kind", "object", "--app-secret", "x"}, []string{"HTTP 401"}},
		{[]string{"export", "order/src", "--kind", "object", "--out", filepath.Join(t.TempDir(), "no", "such", "dir")}, []string{"no such file"}},
		{[]string{"import", "order/x", "--kind", "object", "--in", filepath.Join(t.TempDir(), "missing")}, []string{"no such file"}},
		{[]string{"export"}, []string{"usage: holdfast export TYPE/KEY"}},
	} {
		cliFail(t, srv, c.args, c.wants...)
	}
	for _, c := range []struct{ in, want string }{
		{"{\"key\":\"a\",\"value\":1}\n{oops\n", "line 2: not valid JSON"},
		{`{"key":"a"}`, `line 1: want {"key": SLOT, "value": VALUE}`},
		{`{"key":"log","value":1}`, "reserved"},
	} {
		if r := cli(t, srv, c.in, "import", "order/bad", "--kind", "object"); r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Fatalf("import of %q: %+v, want an error with %q", c.in, r, c.want)
		}
	}
	if r := api(t, srv, "GET", "/api/v1/objects/app_crash/order/bad", nil); len(r["state"].(map[string]any)) != 0 {
		t.Fatalf("a refused import wrote %v", r)
	}
}

func TestClient_ExportImportLog(t *testing.T) {
	srv := startClientServer(t)
	const n = 1250 // a long transfer: a progress bar with --progress
	for i := 0; i < n; i += 125 {
		recs := make([]map[string]any, 0, 125)
		for j := i; j < i+125; j++ {
			r := map[string]any{"body": map[string]any{"i": j, "s": fmt.Sprintf("rec\n%d", j)}}
			if j%2 == 0 {
				r["deduplicationKey"] = fmt.Sprintf("k-%d", j)
			}
			recs = append(recs, r)
		}
		api(t, srv, "POST", "/api/v1/logs/app_crash/ev/src/append", map[string]any{"records": recs[:100]})
		api(t, srv, "POST", "/api/v1/logs/app_crash/ev/src/append", map[string]any{"records": recs[100:]})
	}
	// A body sent over several lines is kept byte for byte; it exports on one.
	req, _ := http.NewRequest("POST", srv.url+"/api/v1/logs/app_crash/ev/src/append", strings.NewReader("{\"records\": [{\"body\": {\"pretty\":\n  [1, 2]}}]}"))
	req.Header.Set("X-App-Key", crashAppKey)
	req.Header.Set("X-App-Secret", crashAppSecret)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("append a body over two lines: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if p := api(t, srv, "GET", fmt.Sprintf("/api/v1/logs/app_crash/ev/src/records?from=%d", n), nil); !strings.Contains(fmt.Sprint(p), "pretty") {
		t.Fatalf("the two-line body: %v", p)
	}

	r := cli(t, srv, "", "export", "ev/src", "--kind", "log", "--progress")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != n+1 || !strings.Contains(r.stderr, "100%") || !strings.Contains(r.stderr, fmt.Sprintf("%d/%d", n+1, n+1)) {
		t.Fatalf("export --progress: exit %d, %d lines, stderr %q", r.code, len(lines), r.stderr)
	}
	var src []logRecord
	for i, l := range lines {
		var rec logRecord
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Offset != uint64(i) {
			t.Fatalf("export line %d: %q (%v)", i, l, err)
		}
		src = append(src, rec)
	}
	if src[0].DeduplicationKey != "k-0" || string(src[n].Body) != `{"pretty":[1,2]}` {
		t.Fatalf("export: first %+v, last %+v", src[0], src[n])
	}

	// Import from stdin with the same batches' worth of progress.
	imp := cli(t, srv, r.stdout, "import", "ev/copy", "--kind", "log", "--progress")
	if imp.code != 0 || imp.stdout != fmt.Sprintf("imported %d records into ev/copy (offsets 0-%d): %d new, 0 already there\n", n+1, n, n+1) || !strings.Contains(imp.stderr, fmt.Sprintf("%d/-", n+1)) {
		t.Fatalf("import --progress: %+v", imp)
	}
	file := filepath.Join(t.TempDir(), "copy.jsonl")
	cliWant(t, srv, fmt.Sprintf("exported %d records to %s\n", n+1, file), "export", "ev/copy", "--kind", "log", "--out", file)
	b, _ := os.ReadFile(file)
	for i, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var rec logRecord
		if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Offset != src[i].Offset || rec.DeduplicationKey != src[i].DeduplicationKey || string(rec.Body) != string(src[i].Body) {
			t.Fatalf("ev/copy offset %d: %s\nwant the source's %+v", i, l, src[i])
		}
	}
	// Importing the same lines again appends nothing: their keys are deduplicated.
	again := cliJSON(t, srv, "import", "ev/copy", "--kind", "log", "--in", file, "--batch", "50")
	if again["imported"] != float64(n+1) || again["firstOffset"] != 0.0 || again["lastOffset"] != float64(n) ||
		again["new"] != 0.0 || again["existing"] != float64(n+1) {
		t.Fatalf("import again: %v", again)
	}
	if b := api(t, srv, "GET", "/api/v1/logs/app_crash/ev/copy/bounds", nil); b["nextOffset"] != float64(n+1) {
		t.Fatalf("after a second import the log has %v", b)
	}
	// One line the log holds (its key), one it does not.
	mixed := `{"body":1,"deduplicationKey":"k-0"}` + "\n" + `{"body":2,"deduplicationKey":"fresh"}` + "\n"
	if r := cli(t, srv, mixed, "import", "ev/copy", "--kind", "log"); r.code != 0 ||
		r.stdout != fmt.Sprintf("imported 2 records into ev/copy (offsets 0-%d): 1 new, 1 already there\n", n+1) {
		t.Fatalf("import of a known and a new record: %+v", r)
	}
	// A short transfer shows no bar, even with --progress; --from starts later.
	if r := cli(t, srv, "", "export", "ev/src", "--kind", "log", "--from", fmt.Sprint(n-2), "--progress"); r.code != 0 || r.stderr != "" || strings.Count(r.stdout, "\n") != 3 {
		t.Fatalf("export --from: %+v", r)
	}

	huge := fmt.Sprintf(`{"body":"%s"}`, strings.Repeat("x", 1<<20+1))
	for _, c := range []struct{ in, want string }{
		{huge, "HTTP 413"},
		{`{"deduplicationKey":"x"}`, "line 1: want {\"body\""},
		{`{"body":1,"deduplicationKey":""}`, "HTTP 422"},
		{`{"body":1,"deduplicationKey":7}`, "line 1: want"},
	} {
		if r := cli(t, srv, c.in, "import", "ev/bad", "--kind", "log"); r.code != 1 || !strings.Contains(r.stderr, c.want) {
			t.Fatalf("import of %.40q: exit %d, stderr %.300q; want %q", c.in, r.code, r.stderr, c.want)
		}
	}
	cliFail(t, srv, []string{"import", "ev/bad", "--kind", "log", "--batch", "0"}, "--batch")
	cliFail(t, srv, []string{"import", "ev/bad", "--kind", "log", "--batch", "101", "--in", file}, "HTTP 422")
}

// TestClient_ImportLogInBatches: the appends of a log import travel in batch
// requests. One refused append stops the import, and the error names what
// was written around it: the appends after it in the same request run anyway.
func TestClient_ImportLogInBatches(t *testing.T) {
	srv := startClientServer(t)
	in := `{"body":1}` + "\n" + `{"body":2}` + "\n" + `{"body":3,"deduplicationKey":""}` + "\n" + `{"body":4}` + "\n" + `{"body":5}` + "\n"
	r := cli(t, srv, in, "import", "ev/mixed", "--kind", "log", "--batch", "2")
	if r.code != 1 || !strings.Contains(r.stderr, "lines 3-4:") || !strings.Contains(r.stderr, "HTTP 422") ||
		!strings.Contains(r.stderr, "lines 5-5, after it in the same request, were written") {
		t.Fatalf("import with a refused append: exit %d, stderr %q", r.code, r.stderr)
	}
	p := api(t, srv, "GET", "/api/v1/logs/app_crash/ev/mixed/records", nil)
	var bodies []string
	for _, rec := range p["records"].([]any) {
		bodies = append(bodies, fmt.Sprint(rec.(map[string]any)["body"]))
	}
	if strings.Join(bodies, ",") != "1,2,5" {
		t.Fatalf("the log holds %v, want 1,2,5 (the appends before and after the refused one)", bodies)
	}
}
