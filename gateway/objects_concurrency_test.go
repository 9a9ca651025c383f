package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

// TestObjects_ConcurrentIncrements: 16 clients incrementing one slot 50 times each
// over HTTP: every increment counts once, each gets its own log_id, and the replies
// agree with the log.
func TestObjects_ConcurrentIncrements(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	const clients, each = 16, 50
	path := objPath("counter", "c1", "n", "increment")
	type result struct{ logID, value uint64 }
	results := make([][]result, clients)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r, err := send(ts.url, "POST", path, `{"by":1}`, nil)
				if err != nil {
					errs <- err
					return
				}
				var res struct {
					LogID uint64 `json:"log_id"`
					Value uint64 `json:"value"`
				}
				if r.status != http.StatusOK || json.Unmarshal(r.body, &res) != nil {
					errs <- fmt.Errorf("client %d: status %d body %s", c, r.status, r.body)
					return
				}
				results[c] = append(results[c], result{res.LogID, res.Value})
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	wantSnap(t, ts, "counter", "c1", clients*each, map[string]string{"n": itoa(clients * each)})
	wantJSON(t, ts.do("GET", objPath("counter", "c1", "n"), nil, nil), http.StatusOK, `{"value":800}`)

	// Each reply's log_id is unique, and as the slot counts from 0 by 1, its value
	// equals its log_id; each client's replies are in increasing order.
	var all []int
	for c, rs := range results {
		for i, r := range rs {
			if r.value != r.logID {
				t.Fatalf("client %d: reply log_id %d value %d", c, r.logID, r.value)
			}
			if i > 0 && r.logID <= rs[i-1].logID {
				t.Fatalf("client %d: log_id %d after %d", c, r.logID, rs[i-1].logID)
			}
			all = append(all, int(r.logID))
		}
	}
	sort.Ints(all)
	for i, id := range all {
		if id != i+1 {
			t.Fatalf("the replies' log_ids are not 1..%d: position %d holds %d", clients*each, i, id)
		}
	}
	items := logPage(t, ts.do("GET", objPath("counter", "c1", "log"), nil, nil))
	if len(items) != clients*each {
		t.Fatalf("%d log items, want %d", len(items), clients*each)
	}
	for i, it := range items {
		if it.LogID != uint64(i+1) || it.Key != "n" || string(it.Value) != itoa(i+1) {
			t.Fatalf("log item %d is %+v", i, it)
		}
	}
}

// TestObjects_ConcurrentObjects: writes to many objects at once stay separate.
func TestObjects_ConcurrentObjects(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	const objects, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, objects)
	for o := 0; o < objects; o++ {
		wg.Add(1)
		go func(o int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r, err := send(ts.url, "POST", objPath("list", "l"+itoa(o), "items", "append"), `{"value":`+itoa(i)+`}`, nil)
				if err != nil {
					errs <- err
					return
				}
				if want := `{"log_id":` + itoa(i+1) + `}`; r.status != http.StatusOK || string(trimNL(r.body)) != want {
					errs <- fmt.Errorf("object %d append %d: status %d body %s, want %s", o, i, r.status, r.body, want)
					return
				}
			}
		}(o)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for o := 0; o < objects; o++ {
		wantSnap(t, ts, "list", "l"+itoa(o), each, map[string]string{"items": "[0,1,2,3,4,5,6,7,8,9]"})
	}
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
