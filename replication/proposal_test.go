package replication

import (
	"bytes"
	"errors"
	"testing"
)

func TestDecodeEntry_RoundTrip(t *testing.T) {
	h := Header{Proposer: 3, Incarnation: 1<<63 | 5, Seq: 300}
	data := appendEntry(nil, h, []byte("payload"))
	got, p, ok, err := DecodeEntry(data)
	if err != nil || !ok || got != h || !bytes.Equal(p, []byte("payload")) {
		t.Fatalf("DecodeEntry = %+v %q %v %v", got, p, ok, err)
	}
	if _, _, ok, err := DecodeEntry(nil); ok || err != nil {
		t.Fatalf("empty entry: ok=%v err=%v, want a no-op", ok, err)
	}
	for _, bad := range [][]byte{{2, 1, 1, 1}, {entryVersion, 1, 0x80}, {entryVersion}} {
		if _, _, _, err := DecodeEntry(bad); !errors.Is(err, ErrBadEntry) {
			t.Errorf("DecodeEntry(%v) err = %v, want ErrBadEntry", bad, err)
		}
	}
}

func FuzzDecodeEntry(f *testing.F) {
	f.Add(appendEntry(nil, Header{Proposer: 1, Incarnation: 2, Seq: 3}, []byte("x")))
	f.Add([]byte{entryVersion, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, p, ok, err := DecodeEntry(data)
		if err != nil || !ok {
			return
		}
		if again := appendEntry(nil, h, p); !bytes.Equal(again[len(again)-len(p):], p) {
			t.Fatalf("payload not preserved")
		}
	})
}

func TestConfig_Validate(t *testing.T) {
	if _, err := (Config{}).withDefaults(); err == nil {
		t.Fatal("a config without Node was accepted")
	}
	c, err := (Config{Node: 1}).withDefaults()
	if err != nil || c.Workers < 4 || c.ElectionTick != 10 || c.Logger == nil {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	if _, err := (Config{Node: 1, ElectionTick: 1, HeartbeatTick: 1}).withDefaults(); err == nil {
		t.Fatal("ElectionTick <= HeartbeatTick was accepted")
	}
}
