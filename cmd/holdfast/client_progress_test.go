package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// The bar's rate counts from the transfer's start, not from the moment the
// bar appeared: its first frame, drawn once a long transfer's count is
// reached, showed all the items done so far over no time at all.
func TestProgress_FirstFrameRateCountsFromTheStart(t *testing.T) {
	for _, total := range []int64{-1, 5 * longTransfer} {
		var b bytes.Buffer
		cmd := &cobra.Command{}
		cmd.SetErr(&b)
		p := newProgress(cmd, true, "importing", total)
		const took = 500 * time.Millisecond
		time.Sleep(took)
		p.add(longTransfer)
		p.done()
		m := regexp.MustCompile(`(\d+) items/s`).FindAllStringSubmatch(b.String(), -1)
		if len(m) == 0 {
			t.Fatalf("total %d: no rate in %q", total, b.String())
		}
		rate, _ := strconv.Atoi(m[0][1])
		if limit := int(float64(longTransfer) / took.Seconds() * 1.2); rate > limit {
			t.Fatalf("total %d: the first frame says %d items/s for %d items over at least %v (at most %d)", total, rate, longTransfer, took, limit)
		}
	}
}
