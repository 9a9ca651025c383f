// Package slogx holds small log/slog helpers shared by the packages.
package slogx

import (
	"context"
	"log/slog"
)

// MinLevel returns h without the records below min: libraries that log routine
// events at info (protoactor-go) keep only their warnings and errors.
func MinLevel(h slog.Handler, min slog.Level) slog.Handler { return minLevel{h, min} }

type minLevel struct {
	slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.Handler.Enabled(ctx, l)
}

func (m minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{m.Handler.WithAttrs(a), m.min}
}

func (m minLevel) WithGroup(g string) slog.Handler { return minLevel{m.Handler.WithGroup(g), m.min} }
