package persistence

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/holdfast/holdfast/internal/durable"
)

// RepairReport says what RepairWAL found and did.
type RepairReport struct {
	// Damage is where the log stopped making sense; nil when Open succeeded
	// and there was nothing to repair.
	Damage *CorruptionError
	// Dropped counts the records with good checksums at or after the damage
	// (in its segment and in every later one): what truncating there loses,
	// besides the damaged record itself. DroppedFrom and DroppedTo are their
	// lowest and highest seq (0 when none).
	Dropped                  int
	DroppedFrom, DroppedTo   uint64
	DroppedSegments          []string // later segments, removed whole
	SavedTo                  string   // where copies of everything changed were kept
	Repaired                 bool     // the log was changed and the database opened afterwards
	MissingFromStart         bool     // the log starts beyond what the database holds
	AcceptedMissingFromStart bool     // ... and was replayed as it is
}

// RepairWAL is the explicit way past damage that Open refuses to guess about
// (see recovery.go). It opens the database in dataDir (which fails while a node
// runs on it: Badger locks its directory). With no damage it changes nothing.
// Otherwise, without acceptDataLoss, it only reports what a repair would drop.
// With it:
//   - damage inside the log: the damaged segment is cut at the damage (the
//     file is truncated there) and every later segment is removed, after
//     copies of them are saved in dataDir/wal-dropped-<time>; what Badger holds
//     stays;
//   - a log that starts beyond what the database holds: the records in between
//     are nowhere to be found, so nothing can be cut to get them back; the log
//     is replayed as it is.
//
// Then it opens the database, which must succeed, and closes it cleanly.
func RepairWAL(dataDir string, acceptDataLoss bool, log *slog.Logger) (*RepairReport, error) {
	if log == nil {
		log = slog.Default()
	}
	rep := &RepairReport{}
	db, err := Open(Config{Dir: dataDir, Logger: log})
	if err == nil {
		return rep, db.Close()
	}
	if !errors.As(err, &rep.Damage) {
		return rep, err
	}
	ce := rep.Damage
	if ce.missingStart {
		rep.MissingFromStart = true
		if !acceptDataLoss {
			return rep, nil
		}
		db, err := open(Config{Dir: dataDir, Logger: log}, true)
		if err != nil {
			return rep, fmt.Errorf("replay the log as it is: %w", err)
		}
		rep.AcceptedMissingFromStart, rep.Repaired = true, true
		return rep, db.Close()
	}
	if err := countDropped(rep, dataDir); err != nil {
		return rep, err
	}
	if !acceptDataLoss {
		return rep, nil
	}
	rep.SavedTo = filepath.Join(dataDir, "wal-dropped-"+time.Now().UTC().Format("20060102T150405Z"))
	if err := durable.MkdirAll(rep.SavedTo, 0o755); err != nil {
		return rep, err
	}
	if err := copyFile(ce.File, filepath.Join(rep.SavedTo, filepath.Base(ce.File))); err != nil {
		return rep, err
	}
	for _, p := range rep.DroppedSegments {
		if err := os.Rename(p, filepath.Join(rep.SavedTo, filepath.Base(p))); err != nil {
			return rep, fmt.Errorf("move %s aside: %w", p, err)
		}
	}
	if err := durable.SyncDir(rep.SavedTo); err != nil {
		return rep, err
	}
	f, err := os.OpenFile(ce.File, os.O_RDWR, 0)
	if err != nil {
		return rep, err
	}
	// The segment now ends at the damage (the file is never written again:
	// Open starts a new segment after it).
	werr := f.Truncate(ce.Offset)
	if werr == nil {
		werr = fdatasync(f)
	}
	f.Close()
	if werr != nil {
		return rep, fmt.Errorf("cut %s at offset %d: %w", ce.File, ce.Offset, werr)
	}
	if err := durable.SyncDir(filepath.Dir(ce.File)); err != nil {
		return rep, err
	}
	db, err = Open(Config{Dir: dataDir, Logger: log})
	if err != nil {
		return rep, fmt.Errorf("open after the repair: %w", err)
	}
	rep.Repaired = true
	return rep, db.Close()
}

// countDropped fills in what cutting the log at rep.Damage drops: the good
// records after it in its segment, and the later segments whole.
func countDropped(rep *RepairReport, dataDir string) error {
	ce := rep.Damage
	note := func(seq uint64) {
		rep.Dropped++
		if rep.DroppedFrom == 0 || seq < rep.DroppedFrom {
			rep.DroppedFrom = seq
		}
		rep.DroppedTo = max(rep.DroppedTo, seq)
	}
	countIn := func(path string, id uint64, from int64) error {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		last := uint64(0)
		for off := from; ; {
			goodOff, seq, ok := goodRecordAfter(id, data, off, last)
			if !ok {
				return nil
			}
			note(seq)
			last = seq
			off = goodOff + 1
		}
	}
	if err := countIn(ce.File, ce.Segment, ce.Offset); err != nil {
		return err
	}
	dir := filepath.Join(dataDir, "wal")
	ids, err := (&wal{dir: dir}).segmentIDs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if id <= ce.Segment {
			continue
		}
		p := segmentName(dir, id)
		rep.DroppedSegments = append(rep.DroppedSegments, p)
		if err := countIn(p, id, 0); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Sync(); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
