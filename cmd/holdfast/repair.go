package main

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/holdfast/holdfast/persistence"
)

// repairCommand is `holdfast repair`: explicit ways past damage that a node
// refuses to guess about at start-up.
func repairCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "repair",
		Short: "Repair a stopped node's data directory",
	}
	var dataDir string
	var accept bool
	wal := &cobra.Command{
		Use:   "wal",
		Short: "Cut the write-ahead log at the damage that stops the node from starting",
		Long: `A node refuses to start when its write-ahead log is damaged anywhere but in
the last write a crash cut short: a record that fails its checksum, a gap in the
sequence, a log that starts beyond the database. It names the file and offset.

Without --accept-data-loss this only reports what a repair would drop. With it,
the log is cut at the damage: the damaged segment is truncated there and every
later segment is moved, with a copy of the damaged one, into
<data-dir>/db/wal-dropped-<time>; the writes in them are lost. Run it only on a
stopped node (it fails while a node holds the directory).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return repairWAL(cmd.OutOrStdout(), filepath.Join(dataDir, "db"), accept)
		},
	}
	wal.Flags().StringVar(&dataDir, "data-dir", "./holdfast-data", "the node's data directory")
	wal.Flags().BoolVar(&accept, "accept-data-loss", false, "cut the log at the damage, dropping what follows")
	cmd.AddCommand(wal)
	return cmd
}

func repairWAL(out io.Writer, dbDir string, accept bool) error {
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := persistence.RepairWAL(dbDir, accept, log)
	if rep != nil && rep.Damage == nil && err == nil {
		fmt.Fprintln(out, "The write-ahead log is sound: nothing to repair.")
		return nil
	}
	if rep != nil && rep.Damage != nil {
		d := rep.Damage
		fmt.Fprintf(out, "Damage: %s at offset %d: %s.\n", d.File, d.Offset, d.Reason)
		switch {
		case rep.AcceptedMissingFromStart:
			fmt.Fprintln(out, "The records between the database and the log's start are nowhere to be found; the log was replayed as it is.")
		case rep.MissingFromStart:
			fmt.Fprintln(out, "The records between the database and the log's start are nowhere to be found; a repair replays the log as it is.")
		case rep.Dropped > 0:
			fmt.Fprintf(out, "Dropped with it: %d records with good checksums (seq %d..%d)", rep.Dropped, rep.DroppedFrom, rep.DroppedTo)
			if len(rep.DroppedSegments) > 0 {
				fmt.Fprintf(out, ", in %d later segments", len(rep.DroppedSegments))
			}
			fmt.Fprintln(out, ".")
		default:
			fmt.Fprintln(out, "No good record follows the damage.")
		}
		if rep.SavedTo != "" {
			fmt.Fprintf(out, "Copies of what was changed are in %s.\n", rep.SavedTo)
		}
		if !accept && err == nil {
			return fmt.Errorf("nothing was changed: run again with --accept-data-loss to cut the log there")
		}
		if rep.Repaired {
			fmt.Fprintln(out, "Repaired: the node can start.")
		}
	}
	return err
}
