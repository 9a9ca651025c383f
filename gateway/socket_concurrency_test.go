package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
)

// TestSocket_SubscribersJoiningDuringWritesMissNothing: 50 subscribers join one
// object at random moments (some resuming with after_log_id) while 8 writers
// make 2,000 writes over REST. Every subscriber's replay matches the change log,
// its live log_ids continue its snapshot without a gap or a repeat, and its
// snapshot plus live events rebuild exactly the final state.
func TestSocket_SubscribersJoiningDuringWritesMissNothing(t *testing.T) {
	const (
		writers     = 8
		perWriter   = 250
		subscribers = 50
	)
	ts := newTestServer(t, cluster.Config{})
	base := ts.url + "/api/v1/objects/app_test/order/hot"
	topic := topicOf("order", "hot")

	write := func(rng *rand.Rand) error {
		slot := fmt.Sprint("s", rng.Intn(8))
		var method, path string
		var body any
		switch rng.Intn(6) {
		case 0:
			method, path, body = "PUT", "/"+slot, map[string]any{"value": rng.Intn(1000)}
		case 1:
			method, path, body = "POST", "/n/increment", map[string]any{"by": 1}
		case 2:
			method, path, body = "PATCH", "", map[string]any{slot: "p", "s9": rng.Intn(5)}
		case 3:
			method, path, body = "POST", "/transaction", []map[string]any{
				{"op": "set", "key": slot, "value": []int{1, 2}}, {"op": "increment", "key": "n", "by": 2},
			}
		case 4:
			method, path = "DELETE", "/"+slot // may change nothing: no log entry then
		case 5:
			method, path, body = "POST", "/list/append", map[string]any{"value": rng.Intn(10)}
		}
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, base+path, rd)
		req.Header.Set("X-App-Key", testApp.Key)
		req.Header.Set("X-App-Secret", testApp.Secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return nil
	}

	type feed struct {
		after  int // -1: no after_log_id
		frames []wsFrame
		ref    string
	}
	feeds := make([]*feed, subscribers)
	clients := make([]*wsClient, subscribers)
	for i := range clients {
		clients[i] = ts.dial(t)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed))
			for i := 0; i < perWriter; i++ {
				if err := write(rng); err != nil {
					errs <- err
					return
				}
			}
		}(int64(w))
	}
	// Subscribers join over about the time the writes take (~1s here), some after.
	rng := rand.New(rand.NewSource(99))
	for i := 0; i < subscribers; i++ {
		time.Sleep(time.Duration(rng.Intn(40)) * time.Millisecond)
		f := &feed{after: -1}
		params := secretParams()
		if i%3 == 0 {
			f.after = rng.Intn(300)
			params["after_log_id"] = f.after
		}
		f.ref = clients[i].join(topic, params)
		feeds[i] = f
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("writes took %v", time.Since(start))

	final := ts.state("order", "hot")
	var finalState map[string]any
	b, _ := json.Marshal(final.State)
	_ = json.Unmarshal(b, &finalState)
	logItems := map[int][]string{} // log_id -> its items, as replay payloads
	for after := 0; ; {
		r := ts.do("GET", fmt.Sprintf("/api/v1/objects/app_test/order/hot/log?after=%d&limit=10000", after), nil, nil)
		var page struct {
			Items []struct {
				Key   string          `json:"key"`
				Value json.RawMessage `json:"value"`
				LogID int             `json:"log_id"`
			} `json:"items"`
		}
		if err := json.Unmarshal(r.body, &page); err != nil {
			t.Fatal(err)
		}
		if len(page.Items) == 0 {
			break
		}
		for _, it := range page.Items {
			p, _ := json.Marshal(map[string]any{"key": it.Key, "value": it.Value, "log_id": it.LogID})
			logItems[it.LogID] = append(logItems[it.LogID], string(p))
			after = it.LogID
		}
	}

	var replayed, live, truncated int
	for i, f := range feeds {
		c := clients[i]
		reply := c.read()
		if reply.Event != "phx_reply" || *reply.Ref != f.ref {
			t.Fatalf("subscriber %d: first frame %v", i, reply)
		}
		// Replay, then the snapshot.
		var gotReplay []string
		var snap struct {
			State map[string]any `json:"state"`
			LogID int            `json:"log_id"`
		}
		for {
			fr := c.read()
			if fr.Event == "snapshot" {
				if err := json.Unmarshal(fr.Payload, &snap); err != nil {
					t.Fatal(err)
				}
				break
			}
			if fr.Event == "log_truncated" && f.after > 0 && len(gotReplay) == 0 &&
				string(fr.Payload) == fmt.Sprintf(`{"after_log_id":%d,"oldest_log_id":1}`, f.after) {
				// An after_log_id above the object's newest when it joined: a
				// log_id it never issued (nothing is compacted here).
				f.after = -1
				truncated++
				continue
			}
			if fr.Event != "change" || f.after < 0 {
				t.Fatalf("subscriber %d: %v before the snapshot", i, fr)
			}
			var it map[string]any
			_ = json.Unmarshal(fr.Payload, &it)
			norm, _ := json.Marshal(it)
			gotReplay = append(gotReplay, string(norm))
		}
		if f.after >= 0 {
			var want []string
			for id := f.after + 1; id <= snap.LogID; id++ {
				for _, p := range logItems[id] {
					var it map[string]any
					_ = json.Unmarshal([]byte(p), &it)
					norm, _ := json.Marshal(it)
					want = append(want, string(norm))
				}
			}
			if !reflect.DeepEqual(gotReplay, want) {
				t.Fatalf("subscriber %d (after %d, snapshot %d): replay of %d items, want %d", i, f.after, snap.LogID, len(gotReplay), len(want))
			}
			replayed += len(gotReplay)
		}
		// Live events from snapshot+1 to the final log_id, contiguous.
		state := snap.State
		next := snap.LogID + 1
		for next <= int(final.LogID) {
			fr := c.read()
			var ev struct {
				Key     string            `json:"key"`
				Value   any               `json:"value"`
				Changes []json.RawMessage `json:"changes"`
				LogID   int               `json:"log_id"`
			}
			if err := json.Unmarshal(fr.Payload, &ev); err != nil {
				t.Fatal(err)
			}
			if ev.LogID != next {
				t.Fatalf("subscriber %d: live %s with log_id %d, want %d (snapshot at %d)", i, fr.Event, ev.LogID, next, snap.LogID)
			}
			apply := func(key string, v any) {
				if v == nil {
					delete(state, key)
				} else {
					state[key] = v
				}
			}
			switch fr.Event {
			case "change":
				apply(ev.Key, ev.Value)
			case "batch":
				for _, raw := range ev.Changes {
					var ch struct {
						Key   string `json:"key"`
						Value any    `json:"value"`
					}
					_ = json.Unmarshal(raw, &ch)
					apply(ch.Key, ch.Value)
				}
			default:
				t.Fatalf("subscriber %d: live %v", i, fr)
			}
			next++
			live++
		}
		if !reflect.DeepEqual(state, finalState) {
			t.Fatalf("subscriber %d rebuilt\n%v\nwant\n%v", i, state, finalState)
		}
		c.noFrame(10 * time.Millisecond)
	}
	t.Logf("final log_id %d; %d replayed items, %d live events and %d log_truncated checked over %d subscribers", final.LogID, replayed, live, truncated, subscribers)
}
