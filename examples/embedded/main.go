// Command embedded is a user-defined object type on an embedded Holdfast runtime,
// with no network: a trial account whose Go handler keeps its state in the object's
// KV storage, records what happened in the object's retained log, and schedules a
// durable alarm that ends the trial, even across a restart.
//
//	go run ./examples/embedded -trial 2s
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/holdfast/holdfast"
)

const app = "app_example"

// Messages of the trial type.
type (
	// Start opens a trial of Plan that ends after For, unless upgraded first.
	Start struct {
		Plan string
		For  time.Duration
	}
	// Upgrade turns the trial into a paid account and cancels its end.
	Upgrade struct{}
	// Status replies with the account (an Account).
	Status struct{}
)

// Account is the reply to Status.
type Account struct {
	Plan, State string   // State: trial, paid or expired
	History     []string // the events of the object's log, oldest first
}

// ErrNotTrial is the reply to Start or Upgrade when the account is past its trial.
var ErrNotTrial = errors.New("trial: the account is not in a trial")

// Trial is the object type. Each turn's Put and SetAlarm commit together when the
// handler returns nil; LogAppend is a commit of its own, durable before the reply.
var Trial = holdfast.TypeSpec{
	Name: "trial",
	Handle: func(c *holdfast.Context, msg any) (any, error) {
		state, _, err := c.Get("state")
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case Start:
			if len(state) > 0 {
				return nil, ErrNotTrial
			}
			if _, err := c.SetAlarm("expire", time.Now().Add(m.For), nil); err != nil {
				return nil, err
			}
			return nil, record(c, "started "+m.Plan, map[string]string{"plan": m.Plan, "state": "trial"})
		case Upgrade:
			if string(state) != "trial" {
				return nil, ErrNotTrial
			}
			if _, err := c.DeleteAlarm("expire"); err != nil {
				return nil, err
			}
			return nil, record(c, "upgraded", map[string]string{"state": "paid"})
		case Status:
			return status(c)
		}
		return nil, fmt.Errorf("trial: unknown message %T", msg)
	},
	Alarms: map[string]holdfast.AlarmHandler{
		// expire runs in the object's turn when the trial's time has come; an
		// error would retry it with backoff.
		"expire": func(c *holdfast.Context, a holdfast.AlarmCall) error {
			return record(c, "expired", map[string]string{"state": "expired"})
		},
	},
}

// record writes the KV entries and appends event to the object's log.
func record(c *holdfast.Context, event string, kv map[string]string) error {
	for k, v := range kv {
		if err := c.Put(k, []byte(v)); err != nil {
			return err
		}
	}
	body, _ := json.Marshal(map[string]string{"event": event})
	_, err := c.LogAppend(holdfast.LogInput{Body: body})
	return err
}

func status(c *holdfast.Context) (Account, error) {
	var a Account
	plan, _, err := c.Get("plan")
	if err != nil {
		return a, err
	}
	state, _, err := c.Get("state")
	if err != nil {
		return a, err
	}
	a.Plan, a.State = string(plan), string(state)
	page, err := c.LogReadHot(0, 0) // this type has no retention: the whole log is hot
	if err != nil {
		return a, err
	}
	for _, r := range page.Records {
		var e struct{ Event string }
		if err := json.Unmarshal(r.Body, &e); err != nil {
			return a, err
		}
		a.History = append(a.History, e.Event)
	}
	return a, nil
}

// open opens the runtime with the trial type.
func open(dir string) (*holdfast.Runtime, error) {
	return holdfast.Open(holdfast.Options{DataDir: dir, Types: []holdfast.TypeSpec{Trial}})
}

// waitState polls account key until it is in state want or ctx ends.
func waitState(ctx context.Context, rt *holdfast.Runtime, key, want string) (Account, error) {
	for {
		v, err := rt.Request(ctx, app, "trial", key, Status{})
		if err != nil {
			return Account{}, err
		}
		if a := v.(Account); a.State == want {
			return a, nil
		}
		select {
		case <-ctx.Done():
			return v.(Account), fmt.Errorf("account %s is %q, want %q: %w", key, v.(Account).State, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// run starts two trials, upgrades one, closes the runtime before the other's
// alarm is due, reopens it and waits for the alarm to end the trial.
func run(ctx context.Context, dir string, trial time.Duration) (ann, bob Account, err error) {
	rt, err := open(dir)
	if err != nil {
		return ann, bob, err
	}
	for _, key := range []string{"ann", "bob"} {
		if _, err := rt.Request(ctx, app, "trial", key, Start{Plan: "pro", For: trial}); err != nil {
			rt.Close(ctx)
			return ann, bob, fmt.Errorf("start %s: %w", key, err)
		}
	}
	if _, err := rt.Request(ctx, app, "trial", "bob", Upgrade{}); err != nil {
		rt.Close(ctx)
		return ann, bob, fmt.Errorf("upgrade bob: %w", err)
	}
	// The alarm is durable: it fires after a restart (or at once, if it fell due
	// while the runtime was closed).
	if err := rt.Close(ctx); err != nil {
		return ann, bob, err
	}
	if rt, err = open(dir); err != nil {
		return ann, bob, err
	}
	defer rt.Close(ctx)
	wctx, cancel := context.WithTimeout(ctx, trial+30*time.Second)
	defer cancel()
	if ann, err = waitState(wctx, rt, "ann", "expired"); err != nil {
		return ann, bob, err
	}
	bob, err = waitState(wctx, rt, "bob", "paid")
	return ann, bob, err
}

func main() {
	trial := flag.Duration("trial", 2*time.Second, "how long a trial lasts")
	flag.Parse()
	dir, err := os.MkdirTemp("", "holdfast-embedded-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ann, bob, err := run(context.Background(), dir, *trial)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("ann: %s %s, history %v\n", ann.Plan, ann.State, ann.History)
	fmt.Printf("bob: %s %s, history %v\n", bob.Plan, bob.State, bob.History)
}
