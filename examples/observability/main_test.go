package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/oncommit/oncommit/internal/pgtest"
)

// syncBuffer is a bytes.Buffer safe for the relay's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDemo runs the example's short demo against the test server: it
// prints where to scrape, process spans linked to their create spans, and
// a scrape holding the messaging metrics and the queue gauges, then exits
// on its own.
func TestDemo(t *testing.T) {
	table := pgtest.Schema(t) + ".outbox"
	var out syncBuffer
	err := run(context.Background(), []string{"-db", pgtest.URL(t), "-table", table, "-addr", "127.0.0.1:0", "-demo", "2s"}, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"scrape http://127.0.0.1:",
		`span "process order.placed" status=`,
		`messaging_client_sent_messages_total{`,
		`messaging_client_consumed_messages_total{`,
		`messaging_process_duration_seconds_count{`,
		`messaging_client_operation_duration_seconds_count{`,
		`oncommit_queue_messages{`,
		`messaging_destination_name="order.placed"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "links-to=none") {
		t.Errorf("a process span without a link to its create span:\n%s", s)
	}
}
