package fwd

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	"github.com/oncommit/oncommit/outbox"
)

// maxWarned is the most header names a Headers warns about: the names
// come from message data, and a set that any caller can add to must not
// grow without bound.
const maxWarned = 64

// Headers decides which of a message's headers a forwarder copies onto
// the broker's message: all but the names the broker acts on (Reserved),
// which are dropped. A drop is logged: at warning level the first time a
// name is dropped (for the first 64 names), at debug level after that.
type Headers struct {
	Reserved func(name string) bool
	Logger   *slog.Logger
	Msg      string // the warning's text

	mu     sync.Mutex
	warned map[string]bool
}

// Keep reports whether d's header name goes to the broker; when it does
// not, Keep logs the drop.
func (h *Headers) Keep(ctx context.Context, d *outbox.Delivery, name string) bool {
	if !h.Reserved(name) {
		return true
	}
	h.mu.Lock()
	first := !h.warned[name] && len(h.warned) < maxWarned
	if first {
		if h.warned == nil {
			h.warned = map[string]bool{}
		}
		h.warned[name] = true
	}
	h.mu.Unlock()
	level := slog.LevelDebug
	if first {
		level = slog.LevelWarn
	}
	h.Logger.Log(ctx, level, h.Msg, "header", name, "topic", d.Topic, "id", d.ID.String())
	return false
}

// HasPrefixFold reports whether name begins with prefix, ignoring ASCII
// case.
func HasPrefixFold(name, prefix string) bool {
	return len(name) >= len(prefix) && strings.EqualFold(name[:len(prefix)], prefix)
}
