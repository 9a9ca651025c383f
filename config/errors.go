package config

import "fmt"

// Error is the error Load and Validate return. It names the key that is wrong, and for a
// value read from the file, the file and the line. Callers use errors.As to reach the fields.
type Error struct {
	// Key is the full key path (types.order.log.retention.maxAge, apps[1].key, cold.s3.bucket),
	// or the environment variable (HOLDFAST_PARTITIONS). It is "" for an error about the
	// whole file (missing, not YAML).
	Key string
	// File is the configuration file the value came from; "" for the environment and flags.
	File string
	// Line is the 1-based line in File; 0 when unknown.
	Line int
	// Msg says what is wrong. It never contains a secret.
	Msg string
	// Err is the underlying error, if any (an *fs.PathError, a YAML syntax error).
	Err error
}

// Error formats as "config: KEY: MSG (FILE:LINE)", or "config: FILE: MSG" without a key.
func (e *Error) Error() string {
	msg := e.Msg
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	switch {
	case e.Key == "":
		return "config: " + e.File + ": " + msg
	case e.File == "":
		return "config: " + e.Key + ": " + msg
	case e.Line == 0:
		return "config: " + e.Key + ": " + msg + " (" + e.File + ")"
	}
	return fmt.Sprintf("config: %s: %s (%s:%d)", e.Key, msg, e.File, e.Line)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }
