// Package goroutine tells tests which goroutine they run on, to assert which
// goroutine did a piece of work (for instance, who committed a write).
package goroutine

import (
	"bytes"
	"runtime"
	"strconv"
)

// ID returns the calling goroutine's id, parsed from its stack header. It is
// slow (it formats a stack): for tests only.
func ID() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, err := strconv.ParseInt(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	if err != nil {
		panic("goroutine: unexpected stack header: " + err.Error())
	}
	return id
}
