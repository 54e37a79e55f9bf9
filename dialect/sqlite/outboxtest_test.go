package sqlite_test

import (
	"testing"

	"github.com/oncommit/oncommit/internal/dialecttest"
)

// TestOutboxtest proves outboxtest.Drain and outboxtest.Published on
// SQLite.
func TestOutboxtest(t *testing.T) { dialecttest.RunOutboxtest(t, harness()) }
