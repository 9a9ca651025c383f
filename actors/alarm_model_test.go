package actors

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/alarms"
)

// The alarms' random model test: random schedules, deletes and clock moves on a
// few objects, against a model of spec/alarms.md. The handler fails on a
// deterministic third of (occurrence, attempt) pairs, so the model knows every
// outcome; it learns a retry's jittered time from the object and checks that it
// is within the backoff's bounds. Every occurrence must run exactly when due,
// once per attempt, with its generation's key, and nothing else may run.

type mAlarm struct {
	at      int64
	gen     uint64
	attempt int
	failed  bool
}

type firedCall struct {
	key  string // object key
	call AlarmCall
}

func alarmFails(call AlarmCall) bool {
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d", call.IdempotencyKey, call.Attempt)
	return h.Sum32()%3 == 0
}

func TestAlarm_RandomModel(t *testing.T) {
	seeds := []int64{1, 2, 3}
	if s := os.Getenv("HOLDFAST_ALARM_SEED"); s != "" {
		n, _ := strconv.ParseInt(s, 10, 64)
		seeds = []int64{n}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runAlarmModel(t, seed, 300) })
	}
}

func runAlarmModel(t *testing.T, seed int64, steps int) {
	const maxAttempts = 3
	rng := rand.New(rand.NewSource(seed))
	clock := newTestClock()
	var mu sync.Mutex
	var calls []firedCall
	a := &alarmer{}
	a.behave = func(c *Context, call AlarmCall) error {
		mu.Lock()
		calls = append(calls, firedCall{c.ID().Key, call})
		mu.Unlock()
		if alarmFails(call) {
			return errors.New("refused by the model")
		}
		return nil
	}
	n := startAlarmNode(t, t.TempDir(), clock, alarmOpts(maxAttempts), a)
	ctx := context.Background()
	keys, names := []string{"o1", "o2", "o3"}, []string{"tick", "tock"}
	model := map[[2]string]*mAlarm{}
	seen := 0 // calls checked so far

	// settle waits until every due occurrence ran once and checks each call.
	settle := func(where string) {
		now := clock.Now().UnixMilli()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			fresh := append([]firedCall(nil), calls[seen:]...)
			mu.Unlock()
			for _, fc := range fresh {
				seen++
				k := [2]string{fc.key, fc.call.Name}
				m := model[k]
				id := ObjectID{App: "app_t", Type: "alarmer", Key: fc.key}
				switch {
				case m == nil || m.failed || m.at > now:
					t.Fatalf("%s: unexpected call %s %+v (model %+v, now %d)", where, fc.key, fc.call, m, now)
				case fc.call.Attempt != m.attempt || fc.call.IdempotencyKey != alarms.IdempotencyKey(id, fc.call.Name, m.gen):
					t.Fatalf("%s: call %s %+v, model %+v", where, fc.key, fc.call, m)
				}
				if !alarmFails(fc.call) {
					delete(model, k)
					continue
				}
				m.attempt++
				if m.attempt >= maxAttempts {
					m.failed = true
					continue
				}
				var info *AlarmInfo
				for {
					var err error
					if info, err = NewAlarms(n.host, id).Get(ctx, fc.call.Name); err != nil {
						t.Fatalf("%s: get after a failure: %v", where, err)
					}
					if info.Attempt == m.attempt {
						break
					}
				}
				base := alarms.Backoff(m.attempt, 0).Milliseconds()
				if info.At < now+base*8/10 || info.At > now+base {
					t.Fatalf("%s: retry %d at %d, want within [%d, %d]", where, m.attempt, info.At, now+base*8/10, now+base)
				}
				m.at = info.At
			}
			due := 0
			for _, m := range model {
				if !m.failed && m.at <= now {
					due++
				}
			}
			if due == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d occurrences due at %d never ran", where, due, now)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}

	for step := range steps {
		key, name := keys[rng.Intn(len(keys))], names[rng.Intn(len(names))]
		al := n.alarms(key)
		k := [2]string{key, name}
		where := fmt.Sprintf("seed %d step %d", seed, step)
		switch r := rng.Intn(100); {
		case r < 40:
			at := clock.Now().Add(time.Duration(rng.Intn(6000)-1000) * time.Millisecond)
			s, err := al.Set(ctx, name, at, nil)
			if err != nil {
				t.Fatalf("%s: set: %v", where, err)
			}
			model[k] = &mAlarm{at: at.UnixMilli(), gen: s.Generation}
		case r < 55:
			err := al.Delete(ctx, name)
			if _, ok := model[k]; ok != (err == nil) || (err != nil && !errors.Is(err, ErrNotFound)) {
				t.Fatalf("%s: delete %v with model %v", where, err, model[k])
			}
			delete(model, k)
		default:
			n.advance(time.Duration(rng.Intn(2000)) * time.Millisecond)
		}
		settle(where)
		if step%10 == 0 || step == steps-1 {
			for _, key := range keys {
				list, err := n.alarms(key).List(ctx)
				if err != nil {
					t.Fatal(err)
				}
				want := 0
				for _, name := range names {
					if model[[2]string{key, name}] != nil {
						want++
					}
				}
				if len(list) != want {
					t.Fatalf("%s: %s lists %+v, model has %d", where, key, list, want)
				}
				for _, info := range list {
					m := model[[2]string{key, info.Name}]
					st := AlarmPending
					if m.failed {
						st = AlarmFailed
					}
					if m == nil || info.At != m.at || info.Generation != m.gen || info.Attempt != m.attempt || info.Status != st {
						t.Fatalf("%s: %s lists %+v, model %+v", where, key, info, m)
					}
				}
			}
		}
	}
	t.Logf("%d handler calls, %d alarms left", seen, len(model))
	if seen < 20 {
		t.Fatalf("only %d handler calls in %d steps: the model exercised little", seen, steps)
	}
}
