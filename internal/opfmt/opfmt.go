// Package opfmt writes filters and purges in the short form that the
// outbox's operator log lines, the CLI and the dashboard share.
package opfmt

import (
	"fmt"
	"strings"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Filter returns f in a short form for logs and confirmations, such
// as `state=dead topic="order.placed"`; "all" when f selects every message.
func Filter(f outboxdriver.Filter) string {
	var b []string
	if len(f.IDs) == 1 {
		b = append(b, "id="+f.IDs[0].String())
	} else if len(f.IDs) > 1 {
		b = append(b, fmt.Sprintf("ids=%d", len(f.IDs)))
	}
	if len(f.States) > 0 {
		ss := make([]string, len(f.States))
		for i, s := range f.States {
			ss[i] = string(s)
		}
		b = append(b, "state="+strings.Join(ss, ","))
	}
	for _, kv := range [][2]string{{"topic", f.Topic}, {"subscriber", f.Subscriber}, {"key", f.Key}, {"error", f.ErrorContains}} {
		if kv[1] != "" {
			b = append(b, fmt.Sprintf("%s=%q", kv[0], kv[1]))
		}
	}
	for _, kv := range []struct {
		k string
		t time.Time
	}{{"created>=", f.CreatedFrom}, {"created<", f.CreatedTo}, {"settled>=", f.SettledFrom}, {"settled<", f.SettledTo}} {
		if !kv.t.IsZero() {
			b = append(b, kv.k+kv.t.UTC().Format(time.RFC3339Nano))
		}
	}
	if !f.After.IsZero() {
		b = append(b, "after="+f.After.String())
	}
	if len(b) == 0 {
		return "all"
	}
	return strings.Join(b, " ")
}

// Purge returns what a purge of states settled more than olderThan
// ago deletes, in the form of [Filter], for logs and confirmations:
// `state=dead,delivered settled<168h0m0s ago`.
func Purge(states []outboxdriver.State, olderThan time.Duration) string {
	if len(states) == 0 {
		states = []outboxdriver.State{outboxdriver.StateDead, outboxdriver.StateDelivered}
	}
	ss := make([]string, len(states))
	for i, s := range states {
		ss[i] = string(s)
	}
	return "state=" + strings.Join(ss, ",") + " settled<" + olderThan.String() + " ago"
}
