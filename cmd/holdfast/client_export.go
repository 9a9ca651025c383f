package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	hfclient "github.com/holdfast/holdfast/client"
	"github.com/spf13/cobra"
)

// Export and import move an object's slots or a log's records as JSON lines:
// {"key": SLOT, "value": VALUE} per slot, and per record the record as the
// server returns it ({"offset", "body", "deduplicationKey", "appendedAt"};
// import needs only "body" and keeps "deduplicationKey").

// transferOpts are the flags export and import share.
type transferOpts struct {
	kind     string
	file     string
	progress bool
}

func (t *transferOpts) check() error {
	if t.kind != "object" && t.kind != "log" {
		return fmt.Errorf("--kind %q: want object or log", t.kind)
	}
	return nil
}

// exportCommand is `holdfast export`.
func exportCommand() *cobra.Command {
	cmd, o := clientGroup("export TYPE/KEY --kind object|log [--out FILE]", "Write an object's slots or a log's records as JSON lines")
	cmd.Long = `Write an object's slots (--kind object: one {"key", "value"} line per slot) or its
log's records (--kind log: one {"offset", "body", "deduplicationKey", "appendedAt"}
line per record, from --from, default the oldest readable, up to the end of the log
when the export starts) as JSON lines to stdout or --out FILE. With --out, a
summary is printed when done. A progress bar goes to stderr for long transfers
when stderr is a terminal or with --progress.`
	var (
		t    transferOpts
		from uint64
	)
	cmd.Args = usageArgs(1, 1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := t.check(); err != nil {
			return err
		}
		c, ref, err := o.object(args[0])
		if err != nil {
			return err
		}
		out, commit, err := createOutput(cmd, t.file)
		if err != nil {
			return err
		}
		w := bufio.NewWriterSize(out, 1<<16)
		var n int64
		if t.kind == "object" {
			n, err = exportObject(cmd, c, ref, w, &t)
		} else {
			var fromp *uint64
			if cmd.Flags().Changed("from") {
				fromp = &from
			}
			n, err = exportLog(cmd, c, ref, w, &t, fromp)
		}
		if err == nil {
			err = w.Flush()
		}
		if err = commit(err); err != nil || t.file == "" {
			return err
		}
		if o.json {
			return printValue(cmd.OutOrStdout(), map[string]any{"kind": t.kind, "exported": n, "out": t.file})
		}
		fmt.Fprintf(cmd.OutOrStdout(), "exported %d %s to %s\n", n, itemsOf(t.kind), t.file)
		return nil
	}
	f := cmd.Flags()
	f.StringVar(&t.kind, "kind", "", "what to export: object (its slots) or log (its records)")
	_ = cmd.RegisterFlagCompletionFunc("kind", cobra.FixedCompletions([]string{"object", "log"}, cobra.ShellCompDirectiveNoFileComp))
	f.StringVar(&t.file, "out", "", "write to this file (default: stdout)")
	f.Uint64Var(&from, "from", 0, "--kind log: the first offset (default: the oldest readable)")
	f.BoolVar(&t.progress, "progress", false, "show a progress bar for long transfers even when stderr is not a terminal")
	completeObjects(cmd, o, hfclient.ListObjects)
	return cmd
}

func itemsOf(kind string) string {
	if kind == "object" {
		return "slots"
	}
	return "records"
}

// createOutput opens stdout or a temporary file beside path; commit(err)
// renames the file into place when err is nil and removes it otherwise.
func createOutput(cmd *cobra.Command, path string) (io.Writer, func(error) error, error) {
	if path == "" {
		return cmd.OutOrStdout(), func(err error) error { return err }, nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, nil, err
	}
	return f, func(err error) error {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(f.Name(), path)
		}
		if err != nil {
			os.Remove(f.Name())
		}
		return err
	}, nil
}

func exportObject(cmd *cobra.Command, c *client, ref objectRef, w io.Writer, t *transferOpts) (int64, error) {
	var st struct {
		State map[string]json.RawMessage `json:"state"`
	}
	if _, err := c.call(cmd.Context(), "GET", c.path("objects", ref), nil, nil, &st); err != nil {
		return 0, err
	}
	p := newProgress(cmd, t.progress, "export", int64(len(st.State)))
	defer p.done()
	for _, k := range sortedKeys(st.State) {
		line, err := json.Marshal(struct {
			Key   string          `json:"key"`
			Value json.RawMessage `json:"value"`
		}{k, st.State[k]})
		if err != nil {
			return p.n, err
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return p.n, err
		}
		p.add(1)
	}
	return p.n, nil
}

func exportLog(cmd *cobra.Command, c *client, ref objectRef, w io.Writer, t *transferOpts, from *uint64) (int64, error) {
	ctx := cmd.Context()
	bounds, err := c.bounds(ctx, ref)
	if err != nil {
		return 0, err
	}
	next := bounds.OldestOffset
	if from != nil {
		next = *from
	}
	end := bounds.NextOffset
	p := newProgress(cmd, t.progress, "export", int64(end-min(next, end)))
	defer p.done()
	var line bytes.Buffer
	for next < end {
		var page recordPage
		_, err := c.call(ctx, "GET", c.path("logs", ref, "records"), url.Values{"from": {strconv.FormatUint(next, 10)}}, nil, &page)
		if err != nil {
			return p.n, err
		}
		if len(page.Records) == 0 {
			break
		}
		for _, r := range page.Records {
			// A body is kept as it was sent, maybe over several lines.
			line.Reset()
			if err := json.Compact(&line, r); err != nil {
				return p.n, err
			}
			line.WriteByte('\n')
			if _, err := w.Write(line.Bytes()); err != nil {
				return p.n, err
			}
		}
		p.add(len(page.Records))
		next = page.NextOffset
	}
	return p.n, nil
}
