// Package leakcheck is the packages' leak check for TestMain: after the tests
// passed, no goroutine may be left but the ones named as ignored.
package leakcheck

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// settle is how long goroutines that were told to stop get to end after the
// last test (goleak's own retries give up after about half a second, too soon
// on a loaded machine and for libraries that poll every second).
const settle = 10 * time.Second

// Main runs the tests and then, if they passed, fails the package when a
// goroutine not ignored by opts is still running once settle has passed.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		if err := find(opts); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines left after the tests passed: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func find(opts []goleak.Option) error {
	deadline := time.Now().Add(settle)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
