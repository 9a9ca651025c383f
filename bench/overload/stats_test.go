package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPercentile_NearestRank(t *testing.T) {
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0.1, time.Millisecond}} {
		if got := percentile(ds, c.p); got != c.want {
			t.Errorf("p%v of 1..100 ms = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 99); got != 0 {
		t.Errorf("p99 of nothing = %v, want 0", got)
	}
	// Three values: p99 is the largest, p50 the middle one.
	l := summarize([]time.Duration{3, 1, 2})
	if l.N != 3 || l.P50 != 2 || l.P99 != 3 || l.Max != 3 {
		t.Errorf("summarize(3,1,2) = %+v", l)
	}
}

func TestClassify(t *testing.T) {
	for status, want := range map[int]class{200: acked, 204: acked, 503: refused, 429: refused, 0: other, 500: other, 413: other, 404: other} {
		if got := classify(status); got != want {
			t.Errorf("classify(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	ms, ok, hdr := retryAfter([]byte(`{"error":"over budget","code":"unavailable","retryAfterMs":500}`), "1")
	if ms != 500 || !ok || !hdr {
		t.Errorf("a full refusal: %d %v %v", ms, ok, hdr)
	}
	if _, ok, hdr := retryAfter([]byte(`{"error":"x","code":"unavailable"}`), ""); ok || hdr {
		t.Errorf("a refusal without retryAfterMs or header: %v %v", ok, hdr)
	}
	if _, ok, _ := retryAfter([]byte(`<html>busy</html>`), ""); ok {
		t.Error("a non-JSON body has no retryAfterMs")
	}
}

func TestParseProcStatus(t *testing.T) {
	in := "Name:\tholdfast\nVmPeak:\t  999 kB\nVmRSS:\t  3000 kB\nRssAnon:\t  2000 kB\nRssFile:\t   900 kB\nRssShmem:\t 100 kB\nThreads:\t12\n"
	s, err := parseProcStatus(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if s != (procStatus{VmRSS: 3000 << 10, RssAnon: 2000 << 10, RssFile: 900 << 10, RssShmem: 100 << 10}) {
		t.Errorf("parsed %+v", s)
	}
	if _, err := parseProcStatus(strings.NewReader("VmRSS:\t12 MB\n")); err == nil {
		t.Error("a unit other than kB must be an error")
	}
}

func TestParseMetrics(t *testing.T) {
	in := `# HELP holdfast_memory_live_bytes The live Go heap.
# TYPE holdfast_memory_live_bytes gauge
holdfast_memory_live_bytes 1.2345e+08
holdfast_http_requests_total{route="x"} 7
go_memstats_heap_inuse_bytes 5e+08
other 1
`
	m, err := parseMetrics(strings.NewReader(in), sampledMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 2 || m["holdfast_memory_live_bytes"] != 1.2345e8 || m["go_memstats_heap_inuse_bytes"] != 5e8 {
		t.Errorf("parsed %v", m)
	}
}

func TestValues_DeterministicAndDistinct(t *testing.T) {
	v := newValues(4096, 7)
	a, b := v.value("p2-w001-000001", 3000), v.value("p2-w001-000002", 3000)
	if len(a) != 3000 || string(a) != string(newValues(4096, 7).value("p2-w001-000001", 3000)) {
		t.Fatalf("a value must be rebuilt from its key and length alone (len %d)", len(a))
	}
	if string(a[20:]) == string(b[20:]) {
		t.Error("two keys give the same content")
	}
	for _, c := range a {
		if !strings.ContainsRune(valueAlphabet+"-.", rune(c)) {
			t.Fatalf("byte %q needs escaping in JSON", c)
		}
	}
}

func TestCounterVerdict(t *testing.T) {
	for _, c := range []struct {
		acked, uncertain int
		got              int64
		found            bool
		want             string // prefix; "" means fine
	}{
		{5, 0, 5, true, ""},
		{5, 2, 7, true, ""},
		{5, 2, 6, true, ""},
		{5, 0, 4, true, "LOST"},
		{1, 0, 0, false, "LOST"},
		{0, 3, 0, false, ""},
		{5, 1, 7, true, "PHANTOM"},
	} {
		got := counterVerdict(c.acked, c.uncertain, c.got, c.found)
		if (c.want == "") != (got == "") || !strings.HasPrefix(got, c.want) {
			t.Errorf("counterVerdict(%d acked, %d uncertain, %d, found %v) = %q, want %q", c.acked, c.uncertain, c.got, c.found, got, c.want)
		}
	}
}

func TestSlotVerdict(t *testing.T) {
	want := []byte("k.ABC")
	if v := slotVerdict(want, []byte(`{"value":"k.ABC"}`+"\n"), true); v != "" {
		t.Errorf("the right value: %q", v)
	}
	for name, c := range map[string]struct {
		body  string
		found bool
	}{
		"missing":   {``, false},
		"shorter":   {`{"value":"k.AB"}`, true},
		"different": {`{"value":"k.ABD"}`, true},
		"number":    {`{"value":3}`, true},
		"not json":  {`oops`, true},
	} {
		if v := slotVerdict(want, []byte(c.body), c.found); v == "" {
			t.Errorf("%s: no problem found", name)
		}
	}
}

// TestVerify_FindsLostAndWrongWrites runs the read-back against a fake server
// that lost one increment and one large value, changed another, and refuses
// each read once (503 with retryAfterMs) before it answers.
func TestVerify_FindsLostAndWrongWrites(t *testing.T) {
	vals := newValues(2048, 1)
	good, lost, wrong := bigWrite{"good", 1500}, bigWrite{"lost", 1200}, bigWrite{"wrong", 1000}
	counters := map[string]int{"c0": 3, "c1": 1} // c1 lost one of its two acknowledged increments
	var refusedOnce onceSet
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-App-Key") != "pk" {
			w.WriteHeader(401)
			return
		}
		if refusedOnce.first(r.URL.Path) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			fmt.Fprint(w, `{"error":"over budget","code":"unavailable","retryAfterMs":1}`)
			return
		}
		parts := strings.Split(r.URL.Path, "/") // /api/v1/objects/app/type/key/slot
		typ, key := parts[5], parts[6]
		switch {
		case typ == "counter":
			if n, ok := counters[key]; ok {
				fmt.Fprintf(w, `{"value":%d}`, n)
				return
			}
		case key == good.Key:
			fmt.Fprintf(w, `{"value":"%s"}`, vals.value(good.Key, good.N))
			return
		case key == wrong.Key:
			v := vals.value(wrong.Key, wrong.N)
			v[len(v)-1] ^= 1
			fmt.Fprintf(w, `{"value":"%s"}`, v)
			return
		}
		w.WriteHeader(404)
		fmt.Fprint(w, `{"error":"not found","code":"not_found"}`)
	}))
	defer srv.Close()
	c := &client{http: srv.Client(), url: srv.URL, app: appCreds{ID: "app", Key: "pk", Secret: "sk"}}
	a := mergeAcks([]*writerLog{
		{ackedIncr: map[int]int{0: 2, 1: 2}, uncertainIncr: map[int]int{0: 1, 2: 4}},
		{big: []bigWrite{good, lost}},
	}, []*writerLog{{ackedIncr: map[int]int{}, big: []bigWrite{wrong}}})
	res := verify(c, a, vals, 2, 10*time.Second, time.Minute)
	if res.Counters != 3 || res.Slots != 3 {
		t.Errorf("checked %d counters and %d slots, want 3 and 3", res.Counters, res.Slots)
	}
	if res.Refusals != 6 || len(res.Unreadable) != 0 {
		t.Errorf("%d refusals retried (want 6), unreadable %v", res.Refusals, res.Unreadable)
	}
	got := strings.Join(res.Problems, "\n")
	if len(res.Problems) != 3 || !strings.Contains(got, "/counter/c1/n: LOST") || !strings.Contains(got, "/big/lost/v: LOST") || !strings.Contains(got, "/big/wrong/v: WRONG") {
		t.Errorf("problems:\n%s\nwant c1 and big/lost lost, big/wrong wrong", got)
	}
}

// onceSet answers true the first time it is asked about a key.
type onceSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (m *onceSet) first(k string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen[k] {
		return false
	}
	if m.seen == nil {
		m.seen = map[string]bool{}
	}
	m.seen[k] = true
	return true
}

func TestRunReport_Verdicts(t *testing.T) {
	r := &runReport{Budget: 100, Phases: []phaseReport{{Mem: memMax{RssAnon: 90}, Groups: []groupStats{{Refused: 4, WithMs: 4}}}}}
	if rss, retry, lost := r.verdicts(); !rss || !retry || !lost {
		t.Fatalf("a good run: %v %v %v", rss, retry, lost)
	}
	r.Phases[0].Mem.RssAnon = 101
	r.Phases[0].Groups[0].WithMs = 3
	r.VerifyRestart.Unreadable = []string{"x"}
	if rss, retry, lost := r.verdicts(); rss || retry || lost {
		t.Errorf("RSS over, a refusal without retryAfterMs, a write not read back: %v %v %v", rss, retry, lost)
	}
	r.VerifyRestart.Unreadable = nil
	r.Verify.Problems = []string{"LOST"}
	if _, _, lost := r.verdicts(); lost {
		t.Error("a lost write")
	}
}

func TestTimeline_BucketsAndRemainder(t *testing.T) {
	base := []*writerLog{{replies: []reply{
		{At: 10 * time.Second, Latency: time.Millisecond, Class: acked},
		{At: 14 * time.Second, Latency: 3 * time.Millisecond, Class: acked},
		{At: 15 * time.Second, Class: refused},
		{At: 20500 * time.Millisecond, Latency: time.Millisecond, Class: acked}, // past 2 steps: the last bucket's
		{At: 9 * time.Second, Class: acked},                                     // before the phase
	}}}
	big := []*writerLog{{replies: []reply{{At: 11 * time.Second, Class: refused}}}}
	ss := []sample{{At: 12 * time.Second, procStatus: procStatus{RssAnon: 5}}, {At: 16 * time.Second, procStatus: procStatus{RssAnon: 7}}}
	bs := timeline(10*time.Second, 20600*time.Millisecond, 5*time.Second, base, big, ss)
	if len(bs) != 2 {
		t.Fatalf("%d buckets, want 2", len(bs))
	}
	if b := bs[0]; b.From != 0 || b.BaseAcked != 2 || b.BigRefused != 1 || b.BaseP99 != 3*time.Millisecond || b.RssAnon != 5 {
		t.Errorf("first bucket %+v", b)
	}
	if b := bs[1]; b.From != 5*time.Second || b.BaseAcked != 1 || b.BaseRefused != 1 || b.RssAnon != 7 {
		t.Errorf("second bucket %+v", b)
	}
}
