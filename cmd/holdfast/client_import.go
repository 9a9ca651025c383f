package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	hfclient "github.com/holdfast/holdfast/client"
	"github.com/spf13/cobra"
)

// importChunkBytes bounds the body of one import request (the server takes 8 MiB).
const importChunkBytes = 4 << 20

// importCommand is `holdfast import`.
func importCommand() *cobra.Command {
	cmd, o := clientGroup("import TYPE/KEY --kind object|log [--in FILE]", "Write JSON lines from export into an object or a log")
	cmd.Long = `Read the JSON lines that export writes (from stdin or --in FILE) into an object
or a log.

--kind object: each {"key", "value"} line sets that slot; the slots are written by
PATCH in chunks (each chunk is one write), and slots of the object that are not in
the input are kept. --kind log: each line's "body" is appended, in appends of
--batch records, with its "deduplicationKey" when it has one, so that importing
the same lines again appends nothing while the originals are in the hot window.
Up to 1,000 appends (4 MiB) travel in one request (POST /api/v1/batch), and run
in their order.

The import stops at the first bad line or refused request; what was written
before stays. When one append of a batch request is refused, the appends after
it in that request are still written (a batch's operations stand alone): the
error says which input lines were written and which were not. A progress bar
goes to stderr for long transfers when stderr is a terminal or with --progress.`
	var (
		t     transferOpts
		batch int
	)
	cmd.Args = usageArgs(1, 1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := t.check(); err != nil {
			return err
		}
		if batch < 1 {
			return errors.New("--batch must be at least 1")
		}
		c, ref, err := o.object(args[0])
		if err != nil {
			return err
		}
		in, total, closeIn, err := openInput(cmd, t.file)
		if err != nil {
			return err
		}
		defer closeIn()
		im := &importer{cmd: cmd, c: c, ref: ref, kind: t.kind, batch: batch,
			p: newProgress(cmd, t.progress, "import", total)}
		defer im.p.done()
		if err := im.run(bufio.NewReaderSize(in, 1<<16)); err != nil {
			return err
		}
		im.p.done()
		return im.report(o.json)
	}
	f := cmd.Flags()
	f.StringVar(&t.kind, "kind", "", "what to import into: object (slots) or log (records)")
	_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions([]string{"object", "log"}, cobra.ShellCompDirectiveNoFileComp))
	f.StringVar(&t.file, "in", "", "read this file (default: stdin)")
	f.IntVar(&batch, "batch", 100, "--kind log: records per append (at most the type's maxBatchSize)")
	f.BoolVar(&t.progress, "progress", false, "show a progress bar for long transfers even when stderr is not a terminal")
	completeObjects(cmd, o, hfclient.ListObjects)
	return cmd
}

// openInput opens stdin or path; total is its line count when it is a file
// (for the progress bar), else -1.
func openInput(cmd *cobra.Command, path string) (io.Reader, int64, func(), error) {
	if path == "" {
		return cmd.InOrStdin(), -1, func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, nil, err
	}
	total, err := countLines(f)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	return f, total, func() { f.Close() }, nil
}

func countLines(r io.Reader) (int64, error) {
	buf := make([]byte, 1<<16)
	var n int64
	for {
		k, err := r.Read(buf)
		n += int64(bytes.Count(buf[:k], []byte{'\n'}))
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// importer sends the input in chunks: PATCH bodies, or append batches.
type importer struct {
	cmd   *cobra.Command
	c     *client
	ref   objectRef
	kind  string
	batch int
	p     *progress

	slots   map[string]json.RawMessage // the pending PATCH
	records []map[string]any           // the pending append
	appends []batchAppend              // the pending batch of appends (--kind log)
	size    int                        // bytes pending
	line    int                        // input lines taken so far

	imported          int64
	logID             uint64
	firstOff, lastOff uint64
	// fresh and known count the records imported (--kind log) that were
	// appended, and those whose deduplication key the log held already (its
	// append answered the record's old offset): an offset at or past next,
	// the log's next offset when the import started or after its last new
	// record, is new. (A record another writer appended meanwhile under the
	// same key counts as new.)
	fresh, known int64
	next         uint64
	nextRead     bool
}

func (im *importer) run(r *bufio.Reader) error {
	for lineNo := 1; ; lineNo++ {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if perr := im.add(line); perr != nil {
				return fmt.Errorf("line %d: %w", lineNo, perr)
			}
		}
		if err == io.EOF {
			return im.flush()
		}
		if err != nil {
			return err
		}
	}
}

// add queues one line and flushes the chunk when it is full.
func (im *importer) add(line []byte) error {
	var v struct {
		Key              *string         `json:"key"`
		Value            json.RawMessage `json:"value"`
		Body             json.RawMessage `json:"body"`
		DeduplicationKey *string         `json:"deduplicationKey"`
	}
	if !json.Valid(line) {
		return errors.New("not valid JSON")
	}
	if json.Unmarshal(line, &v) != nil {
		v.Key, v.Value, v.Body = nil, nil, nil // a field of the wrong type: the shape is wrong
	}
	if im.kind == "object" {
		if v.Key == nil || len(v.Value) == 0 {
			return errors.New(`want {"key": SLOT, "value": VALUE}`)
		}
		if im.slots == nil {
			im.slots = map[string]json.RawMessage{}
		}
		im.slots[*v.Key] = v.Value
	} else {
		if len(v.Body) == 0 {
			return errors.New(`want {"body": ..., "deduplicationKey"?: "..."}`)
		}
		rec := map[string]any{"body": v.Body}
		if v.DeduplicationKey != nil {
			rec["deduplicationKey"] = *v.DeduplicationKey
		}
		im.records = append(im.records, rec)
	}
	im.line++
	im.size += len(line)
	if len(im.records) >= im.batch {
		im.appends = append(im.appends, batchAppend{records: im.records, first: im.line - len(im.records) + 1})
		im.records = nil
	}
	if im.size >= importChunkBytes || len(im.appends) >= maxImportAppends || len(im.slots) >= 1000 {
		return im.flush()
	}
	return nil
}

// maxImportAppends is the most appends one batch request carries (the batch
// route's limit).
const maxImportAppends = 1000

// batchAppend is one append of a batch request: its records and the input
// line of its first.
type batchAppend struct {
	records []map[string]any
	first   int
}

// flush sends the pending chunk.
func (im *importer) flush() error {
	ctx := im.cmd.Context()
	switch {
	case len(im.slots) > 0:
		var r struct {
			LogID uint64 `json:"log_id"`
		}
		if _, err := im.c.call(ctx, "PATCH", im.c.path("objects", im.ref), nil, im.slots, &r); err != nil {
			return err
		}
		im.logID = r.LogID
		im.done(len(im.slots))
		im.slots = nil
	case len(im.records) > 0 || len(im.appends) > 0:
		if len(im.records) > 0 {
			im.appends = append(im.appends, batchAppend{records: im.records, first: im.line - len(im.records) + 1})
			im.records = nil
		}
		err := im.sendAppends(ctx)
		im.appends = im.appends[:0]
		if err != nil {
			return err
		}
	}
	im.size = 0
	return nil
}

// sendAppends sends the pending appends in one batch request. Every append
// that was written counts (its offsets too), the ones after a refused append
// included; the first refusal is the error, naming the input lines written
// and not.
func (im *importer) sendAppends(ctx context.Context) error {
	if !im.nextRead {
		b, err := im.c.bounds(ctx, im.ref)
		if err != nil {
			return err
		}
		im.next, im.nextRead = b.NextOffset, true
	}
	object := im.ref.typ + "/" + im.ref.key
	ops := make([]map[string]any, len(im.appends))
	for i, a := range im.appends {
		ops[i] = map[string]any{"object": object, "op": "log.append", "records": a.records}
	}
	var reply struct {
		Results []struct {
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"`
		} `json:"results"`
	}
	if _, err := im.c.call(ctx, "POST", "/api/v1/batch/"+url.PathEscape(im.c.key), nil, map[string]any{"ops": ops}, &reply); err != nil {
		return err
	}
	if len(reply.Results) != len(ops) {
		return fmt.Errorf("the server answered %d results for %d appends", len(reply.Results), len(ops))
	}
	var refused error
	var written []string
	for i, r := range reply.Results {
		a := im.appends[i]
		lines := fmt.Sprintf("%d-%d", a.first, a.first+len(a.records)-1)
		if r.Status < 200 || r.Status > 299 {
			if refused == nil {
				refused = fmt.Errorf("lines %s: %w", lines, decodeServerError(r.Status, http.Header{}, r.Body))
			}
			continue
		}
		var out struct {
			Offsets []uint64 `json:"offsets"`
		}
		if err := json.Unmarshal(r.Body, &out); err != nil {
			return fmt.Errorf("the server's reply is not what was expected: %w", err)
		}
		if len(out.Offsets) > 0 {
			if im.imported == 0 {
				im.firstOff = out.Offsets[0]
			}
			im.lastOff = out.Offsets[len(out.Offsets)-1]
		}
		for _, off := range out.Offsets {
			if off >= im.next {
				im.fresh, im.next = im.fresh+1, off+1
			} else {
				im.known++
			}
		}
		im.done(len(a.records))
		if refused != nil {
			written = append(written, lines)
		}
	}
	if refused != nil && len(written) > 0 {
		return fmt.Errorf("%w; lines %s, after it in the same request, were written", refused, strings.Join(written, ", "))
	}
	return refused
}

func (im *importer) done(n int) {
	im.imported += int64(n)
	im.p.add(n)
}

func (im *importer) report(asJSON bool) error {
	w := im.cmd.OutOrStdout()
	name := im.ref.typ + "/" + im.ref.key
	switch {
	case asJSON && im.kind == "object":
		return printValue(w, map[string]any{"kind": "object", "imported": im.imported, "log_id": im.logID})
	case asJSON:
		return printValue(w, map[string]any{"kind": "log", "imported": im.imported, "firstOffset": im.firstOff, "lastOffset": im.lastOff,
			"new": im.fresh, "existing": im.known})
	case im.imported == 0:
		fmt.Fprintf(w, "imported nothing into %s\n", name)
	case im.kind == "object":
		fmt.Fprintf(w, "imported %d slots into %s (log_id %d)\n", im.imported, name, im.logID)
	default:
		fmt.Fprintf(w, "imported %d records into %s (offsets %d-%d): %d new, %d already there\n", im.imported, name, im.firstOff, im.lastOff, im.fresh, im.known)
	}
	return nil
}
