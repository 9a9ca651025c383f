// Package powercut is the harness of the power-cut tests (persistence's and
// replication's): a writer process runs the storage on an internal/powerfs
// mount under load; the test cuts the power at a random moment, kills the
// writer, and starts it again on what was synced; every acknowledged write
// must be there, and nothing above what was ever written.
//
// The writer is the test binary itself, started with -test.run=ChildTest and
// DirEnv naming its data directory. It speaks in lines, one write(2) each:
// "have KEY N" for the version of every key it found at start (0 for none),
// then "ready", then "ack KEY N" once a write of version N of KEY is
// acknowledged (each key has at most one write in flight, versions one
// after another), and "error ..." before it exits on a failure. Lines of
// other kinds go to Options.Line.
package powercut

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/powerfs"
)

// ErrLostWrite marks a check that found an acknowledged write missing: what a
// planted bug must produce (any other failure is not a catch).
var ErrLostWrite = errors.New("acknowledged write lost")

// Options configure Run.
type Options struct {
	// ChildTest is the writer's test (a name, matched exactly).
	ChildTest string
	// DirEnv is the environment variable that gives the writer its data
	// directory; Env is more of its environment.
	DirEnv string
	Env    []string
	// KeepDirEnv, if set in the environment, names a directory to work in
	// and keep for a look after a failure, instead of a temporary one.
	KeepDirEnv string
	// Cuts is how many times the power is cut.
	Cuts int
	// CutDelay is how long after the writer is ready a cut under load lands.
	CutDelay func(rng *rand.Rand) time.Duration
	// EarlyOneIn, if above zero, makes one cut in that many land during the
	// writer's start-up or recovery instead (within 400 ms of its start).
	EarlyOneIn int
	// Line takes a line of a kind the harness does not know, split in
	// fields, with the current run; false: the writer said something wrong.
	Line func(f []string, run *Run) bool
	// AfterRun, if set, sees every run that passed its check.
	AfterRun func(run *Run)
	// Final reads the state the last cut left (the directory holds data/,
	// a plain directory by then), in the test process: the versions of the
	// keys, as "have" lines would give them.
	Final func(dir string) (map[string]uint64, error)
}

// Run is what one writer process said before its cut.
type Run struct {
	Ready    bool
	Have     map[string]uint64 // the versions it found at start
	Acks     map[string]uint64 // the highest version acknowledged per key
	AckCount int
	CutAfter time.Duration
	When     string // when the cut came
	Tree     string // the state it started from
	// Extra is the caller's, for what its Line hook parsed.
	Extra map[string]uint64
}

// Result is what Run found.
type Result struct {
	Cuts    int // cuts made before the check that failed, or all
	Checked int // acknowledged writes found after a cut
	Err     error
}

// model is what the test knows of the keys' versions.
type model struct {
	acked   map[string]uint64 // the highest acknowledged version
	written map[string]uint64 // the highest version ever submitted, at most
	pending int               // acknowledgements not yet checked
	checked int               // acknowledgements found in a recovered state
}

// check compares a recovered state with what was acknowledged and written.
func (m *model) check(state map[string]uint64) error {
	for k, a := range m.acked {
		if state[k] < a {
			return fmt.Errorf("%w: key %s holds version %d, version %d was acknowledged", ErrLostWrite, k, state[k], a)
		}
	}
	for k, n := range state {
		if n > m.written[k] {
			return fmt.Errorf("key %s holds version %d, never written (at most %d was)", k, n, m.written[k])
		}
	}
	m.checked += m.pending
	m.pending = 0
	return nil
}

// note takes what a run said into the model.
func (m *model) note(run *Run) {
	if run.Ready {
		// Every key may have had one write in flight, its version at start
		// + 1 or its last acknowledged one + 1.
		for k, n := range run.Have {
			m.written[k] = max(m.written[k], n+1)
		}
	}
	for k, n := range run.Acks {
		m.acked[k] = max(m.acked[k], n)
		m.written[k] = max(m.written[k], n+1)
	}
	m.pending += run.AckCount
}

// RunCuts runs the writer and cuts the power under it o.Cuts times, each
// time starting it again on the state the cut left (the restarted writer
// reports that state first); after the last cut o.Final reads that state in
// the test process. It stops at the first check that fails and returns it
// in the result; a failure of the harness fails t. It skips t without
// /dev/fuse.
func RunCuts(t *testing.T, o Options) Result {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); errors.Is(err, os.ErrNotExist) {
		t.Skip("no /dev/fuse: the power-cut test runs the storage on a FUSE filesystem")
	}
	base := t.TempDir()
	if d := os.Getenv(o.KeepDirEnv); o.KeepDirEnv != "" && d != "" {
		base = d
	}
	mnt := filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 27))
	t.Logf("seed %d", seed)
	m := &model{acked: map[string]uint64{}, written: map[string]uint64{}}
	res := Result{}
	recovered := ""
	for cut := 1; cut <= o.Cuts; cut++ {
		next := filepath.Join(base, fmt.Sprintf("cut-%d", cut))
		run, err := runOnce(t, o, mnt, recovered, next, rng)
		if err == nil && run.Ready {
			err = m.check(run.Have)
		}
		if err != nil {
			res.Cuts, res.Checked = cut-1, m.checked
			res.Err = fmt.Errorf("start %d (after cut %d): %w\nthe tree it started on:\n%s", cut, cut-1, err, run.Tree)
			return res
		}
		if o.AfterRun != nil {
			o.AfterRun(run)
		}
		if recovered != "" {
			_ = os.RemoveAll(recovered) // checked, and loaded into the mount's memory
		}
		recovered = next
		m.note(run)
		res.Cuts = cut
		t.Logf("cut %d: %v after start, %d writes acknowledged (%s)", cut, run.CutAfter.Round(time.Millisecond), run.AckCount, run.When)
	}
	tree := DescribeTree(recovered)
	state, err := o.Final(recovered)
	if err == nil {
		err = m.check(state)
	}
	if err != nil {
		res.Err = fmt.Errorf("after cut %d: %w\nrecovered tree:\n%s", o.Cuts, err, tree)
	}
	res.Checked = m.checked
	return res
}

// runOnce mounts powerfs at mnt over the state in seed (none if empty), runs
// the writer on it, cuts the power at a random moment, and leaves the
// durable state in next. A writer that stops before the cut is an error
// returned; the harness failing fails t.
func runOnce(t *testing.T, o Options, mnt, seed, next string, rng *rand.Rand) (*Run, error) {
	t.Helper()
	run := &Run{Have: map[string]uint64{}, Acks: map[string]uint64{}, Extra: map[string]uint64{}}
	if seed != "" {
		run.Tree = DescribeTree(seed)
	}
	fs, err := powerfs.Mount(mnt, powerfs.Options{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+o.ChildTest+"$")
	cmd.Env = append(append(os.Environ(), o.DirEnv+"="+filepath.Join(mnt, "data")), o.Env...)
	var stderr tailBuffer
	cmd.Stderr = &stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var (
		linesMu sync.Mutex
		lines   []string
		ready   = make(chan struct{})
		read    = make(chan struct{})
		exited  = make(chan struct{})
	)
	go func() { // the reader keeps every complete line until the writer's end
		defer close(read)
		defer r.Close()
		br := bufio.NewReader(r)
		readyOnce := sync.OnceFunc(func() { close(ready) })
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return // a partial last line is not trusted
			}
			line = strings.TrimSuffix(line, "\n")
			linesMu.Lock()
			lines = append(lines, line)
			linesMu.Unlock()
			if line == "ready" {
				readyOnce()
			}
		}
	}()
	go func() {
		defer close(exited)
		_ = cmd.Wait()
	}()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		<-read
	}
	var earlyExit bool
	if o.EarlyOneIn > 0 && rng.IntN(o.EarlyOneIn) == 0 {
		run.When = "during start-up or recovery"
		select {
		case <-time.After(time.Duration(rng.IntN(400)) * time.Millisecond):
		case <-exited:
			earlyExit = true
		}
	} else {
		run.When = "under load"
		select {
		case <-ready:
			select {
			case <-time.After(o.CutDelay(rng)):
			case <-exited:
				earlyExit = true
			}
		case <-exited:
			earlyExit = true
		case <-time.After(2 * time.Minute):
			stop()
			_ = fs.Cut(nil, next)
			t.Fatalf("the writer did not recover within 2 minutes; stderr:\n%s", stderr.String())
		}
	}
	run.CutAfter = time.Since(start)
	if err := fs.Cut(stop, next); err != nil {
		t.Fatal(err)
	}
	linesMu.Lock()
	defer linesMu.Unlock()
	var failure string
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case line == "ready":
			run.Ready = true
		case len(f) == 3 && (f[0] == "have" || f[0] == "ack"):
			n, err := strconv.ParseUint(f[2], 10, 64)
			if err != nil {
				t.Fatalf("writer said %q", line)
			}
			if f[0] == "have" {
				run.Have[f[1]] = n
			} else {
				run.Acks[f[1]] = max(run.Acks[f[1]], n)
				run.AckCount++
			}
		case len(f) > 0 && f[0] == "error":
			if failure == "" {
				failure = line
			}
		default:
			// The testing package's own lines ("PASS" and such) never come:
			// the writer runs until killed.
			if o.Line == nil || !o.Line(f, run) {
				t.Fatalf("writer said %q", line)
			}
		}
	}
	if earlyExit {
		return run, fmt.Errorf("the writer failed before the cut: %s\nstderr:\n%s", failure, stderr.String())
	}
	return run, nil
}

// tailBuffer keeps the last 16 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 16<<10; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

var _ io.Writer = (*tailBuffer)(nil)

// DescribeTree lists the files under dir with their sizes, for a failure's
// message.
func DescribeTree(dir string) string {
	var sb strings.Builder
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(&sb, "  %s: %v\n", p, err)
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			fmt.Fprintf(&sb, "  %s/\n", rel)
			return nil
		}
		if fi, err := d.Info(); err == nil {
			fmt.Fprintf(&sb, "  %s %d\n", rel, fi.Size())
		}
		return nil
	})
	if sb.Len() == 0 {
		return "  (nothing)\n"
	}
	return sb.String()
}
