package sqlite_test

import (
	"testing"

	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/internal/dialecttest"
)

// TestOutboxtest proves outboxtest.Drain and outboxtest.Published on
// SQLite.
func TestOutboxtest(t *testing.T) { dialecttest.RunOutboxtest(t, harness()) }

// TestOutboxtestSqlmock proves outboxtest's sqlmock expectations on the
// SQLite dialect.
func TestOutboxtestSqlmock(t *testing.T) { dialecttest.RunSqlmockKit(t, sqlite.Dialect()) }
