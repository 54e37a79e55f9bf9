package fwd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/oncommit/oncommit/outbox"
)

func TestHasPrefixFold(t *testing.T) {
	for _, c := range []struct {
		name, prefix string
		want         bool
	}{
		{"Nats-Rollup", "Nats-", true},
		{"nats-msg-id", "Nats-", true},
		{"NATS-TTL", "Nats-", true},
		{"Nats-", "Nats-", true},
		{"Nats", "Nats-", false},
		{"traceparent", "Nats-", false},
		{"X-Request-Id", "x-", true},
		{"x", "x-", false},
		{"", "x-", false},
		{"ax-delay", "x-", false},
	} {
		if got := HasPrefixFold(c.name, c.prefix); got != c.want {
			t.Errorf("HasPrefixFold(%q, %q) = %v, want %v", c.name, c.prefix, got, c.want)
		}
	}
}

// TestHeadersKeep: reserved names are dropped, each warned about once and
// logged at debug level after that; past 64 names, drops are logged at
// debug level only.
func TestHeadersKeep(t *testing.T) {
	var b strings.Builder
	h := Headers{
		Reserved: func(name string) bool { return HasPrefixFold(name, "x-") },
		Logger:   slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Msg:      "dropped",
	}
	d := &outbox.Delivery{ID: outbox.NewID(), Topic: "t"}
	ctx := context.Background()
	if !h.Keep(ctx, d, "traceparent") || b.Len() != 0 {
		t.Fatalf("traceparent: dropped, or logged %q", b.String())
	}
	for range 3 {
		if h.Keep(ctx, d, "x-delay") {
			t.Fatal("x-delay kept")
		}
	}
	if w, dbg := strings.Count(b.String(), "level=WARN"), strings.Count(b.String(), "level=DEBUG"); w != 1 || dbg != 2 {
		t.Errorf("x-delay dropped 3 times: %d warnings, %d debug lines; want 1 and 2", w, dbg)
	}
	b.Reset()
	for i := range 100 {
		h.Keep(ctx, d, fmt.Sprintf("x-%d", i))
	}
	if w, dbg := strings.Count(b.String(), "level=WARN"), strings.Count(b.String(), "level=DEBUG"); w != 63 || dbg != 37 {
		t.Errorf("100 more names: %d warnings, %d debug lines; want 63 (up to 64 names in all) and 37", w, dbg)
	}
	if len(h.warned) != maxWarned {
		t.Errorf("%d names remembered, want %d", len(h.warned), maxWarned)
	}
}
