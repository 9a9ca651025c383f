package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/persistence"
)

// TestRepairWAL_CommandReportsThenRepairs: `holdfast repair wal` on a sound
// log says so; on a damaged one it reports the file, the offset and what would
// be dropped and changes nothing without --accept-data-loss; with it, the node's
// database opens again.
func TestRepairWAL_CommandReportsThenRepairs(t *testing.T) {
	dataDir := t.TempDir()
	dbDir := filepath.Join(dataDir, "db")
	db, err := persistence.Open(persistence.Config{Dir: dbDir, SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	p := persistence.NewPipeline(db, persistence.PipelineConfig{})
	p.Start()
	for i := 0; i < 40; i++ {
		w := &persistence.Write{Sets: []persistence.KV{{Key: []byte{byte(i)}, Value: bytes.Repeat([]byte{'v'}, 300)}}}
		if err := p.Submit(w).Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	run := func(args ...string) (string, error) {
		cmd := repairCommand()
		cmd.SilenceErrors, cmd.SilenceUsage = true, true
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"wal", "--data-dir", dataDir}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	// A clean close removed the log: sound.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := run(); err != nil || !strings.Contains(out, "sound") {
		t.Fatalf("sound log: %q %v", out, err)
	}
	// Damage: a segment whose first record fails its checksum, followed by a
	// good one (so it is not a torn last write).
	walDir := filepath.Join(dbDir, "wal")
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(walDir, "0000000000000100.wal")
	if err := os.WriteFile(seg, damagedSegment(t, walDir), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run()
	if err == nil || !strings.Contains(out, seg) || !strings.Contains(out, "offset 0") || !strings.Contains(out, "Dropped with it: 1 records") {
		t.Fatalf("report: %q %v", out, err)
	}
	if _, err := persistence.Open(persistence.Config{Dir: dbDir}); err == nil {
		t.Fatal("the report changed the log")
	}
	out, err = run("--accept-data-loss")
	if err != nil || !strings.Contains(out, "Repaired") {
		t.Fatalf("repair: %q %v", out, err)
	}
	db2, err := persistence.Open(persistence.Config{Dir: dbDir})
	if err != nil {
		t.Fatalf("open after the repair: %v", err)
	}
	db2.Close()
}

// damagedSegment builds the bytes of log segment 100 (persistence/wal.go's
// record format) holding two records, the first with a bad checksum.
func damagedSegment(t *testing.T, walDir string) []byte {
	t.Helper()
	var seg []byte
	for i, seq := range []uint64{100, 101} {
		payload := []byte{1, 1, 'k', 1, 'v'} // set k=v
		hdr := make([]byte, 16)
		binary.LittleEndian.PutUint32(hdr, uint32(len(payload)))
		binary.LittleEndian.PutUint64(hdr[8:], seq)
		var id [8]byte
		binary.LittleEndian.PutUint64(id[:], 100)
		tab := crc32.MakeTable(crc32.Castagnoli)
		c := crc32.Update(0, tab, id[:])
		c = crc32.Update(c, tab, hdr[0:4])
		c = crc32.Update(c, tab, hdr[8:16])
		c = crc32.Update(c, tab, payload)
		if i == 0 {
			c ^= 1
		}
		binary.LittleEndian.PutUint32(hdr[4:], c)
		seg = append(append(seg, hdr...), payload...)
	}
	return append(seg, make([]byte, 4096)...)
}
