package actors

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"strings"

	"github.com/holdfast/holdfast/persistence"
)

// The queue's storage keys (queue.go lists them), the message id's rule,
// and receipts.

func targetKey(ks persistence.Keyspace, sub byte, target string, rest ...[]byte) []byte {
	k := ks.KeyString(sub, target)
	k = append(k, 0)
	for _, r := range rest {
		k = append(k, r...)
	}
	return k
}

func u64(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(max(n, 0))) }

func pairKey(q *queueState, target, id string) []byte {
	return targetKey(q.ks, queuePair, target, []byte(id))
}

func readyKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueReady, target, []byte{p.Class}, u64(p.Due), binary.BigEndian.AppendUint64(nil, p.Seq))
}

func queueDeadKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueDeadIdx, target, u64(p.SettledAt), binary.BigEndian.AppendUint64(nil, p.Seq))
}

// queueDoneKey is a complete pair's entry in the index compaction reads.
func queueDoneKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueDoneIdx, target, u64(p.SettledAt), binary.BigEndian.AppendUint64(nil, p.Seq))
}

func visibleKey(q *queueState, target string, p *queuePairRec) []byte {
	return targetKey(q.ks, queueVisible, target, u64(p.Deadline), binary.BigEndian.AppendUint64(nil, p.Seq))
}

// checkQueueID checks a message id by the rule of every name (checkUserName):
// 1 to 128 bytes, and no control characters (422).
func checkQueueID(id string) *Error {
	if e := checkUserName("message id", id, maxQueueIDBytes, ""); e != nil {
		return e
	}
	if strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return invalidf("a message id must not contain control characters")
	}
	return nil
}

// A receipt names its pair and one delivery of it, and the node run (boot)
// that handed it out: random . boot . target . id.
func newReceipt(boot, target, id string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	enc := base64.RawURLEncoding
	return hex.EncodeToString(b[:]) + "." + boot + "." + enc.EncodeToString([]byte(target)) + "." + enc.EncodeToString([]byte(id))
}

func parseReceipt(r string) (target, id string, ok bool) {
	parts := strings.Split(r, ".")
	if len(parts) != 4 {
		return "", "", false
	}
	t, err1 := base64.RawURLEncoding.DecodeString(parts[2])
	i, err2 := base64.RawURLEncoding.DecodeString(parts[3])
	if err1 != nil || err2 != nil || len(i) == 0 {
		return "", "", false
	}
	return string(t), string(i), true
}
