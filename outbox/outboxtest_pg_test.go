package outbox_test

import (
	"testing"

	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/dialecttest"
)

// TestOutboxtest proves outboxtest.Drain and outboxtest.Published on
// PostgreSQL through lib/pq, pgx's stdlib driver and native pgx (which
// listens for notifications).
func TestOutboxtest(t *testing.T) {
	for _, driver := range pgDrivers {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			dialecttest.RunOutboxtest(t, pgHarness(driver))
		})
	}
}

// TestOutboxtestSqlmock proves outboxtest's sqlmock expectations on the
// PostgreSQL dialect.
func TestOutboxtestSqlmock(t *testing.T) { dialecttest.RunSqlmockKit(t, postgres.Dialect()) }
