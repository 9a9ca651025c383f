package main

import (
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// longTransfer is the number of items (slots or records) from which an export
// or import shows a progress bar: shorter ones finish before a bar says anything.
const longTransfer = 1000

// progress counts a transfer's items and draws a bar on stderr once the
// transfer is long, if bars are on (stderr is a terminal, or --progress).
type progress struct {
	on    bool
	w     *gatedWriter
	desc  string
	total int64 // -1: unknown (a spinner with a count)
	n     int64
	bar   *progressbar.ProgressBar
}

// gatedWriter drops what is written until it is opened: the bar starts with
// the transfer, so that its rate counts from there, and shows once the
// transfer is long. (A bar made when the count got long drew a first frame
// of every item so far over no time: millions of items/s.)
type gatedWriter struct {
	w    io.Writer
	open bool
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	if !g.open {
		return len(b), nil
	}
	return g.w.Write(b)
}

// newProgress returns the progress of a transfer of total items (-1: unknown).
func newProgress(cmd *cobra.Command, forced bool, desc string, total int64) *progress {
	w := cmd.ErrOrStderr()
	on := forced
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		on = true
	}
	p := &progress{on: on, w: &gatedWriter{w: w}, desc: desc, total: total}
	if on {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("items"),
			progressbar.OptionThrottle(100_000_000), // 100ms
			progressbar.OptionOnCompletion(func() { _, _ = io.WriteString(p.w, "\n") }),
		)
		_ = p.bar.Add(0) // starts its clock (a spinner's starts at its first Add)
	}
	return p
}

// add counts n more items.
func (p *progress) add(n int) {
	p.n += int64(n)
	if p.bar == nil {
		return
	}
	if !p.w.open && (p.total >= longTransfer || (p.total < 0 && p.n >= longTransfer)) {
		p.w.open = true
	}
	_ = p.bar.Add(n)
}

// done ends the bar, if one is drawn.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
		if p.total < 0 { // a spinner ends without a newline
			_, _ = io.WriteString(p.w, "\n")
		}
		p.bar = nil
	}
}
