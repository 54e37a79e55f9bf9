package mysql_test

import (
	"testing"

	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/internal/dialecttest"
)

// TestOutboxtest proves outboxtest.Drain and outboxtest.Published on
// MySQL/MariaDB.
func TestOutboxtest(t *testing.T) { dialecttest.RunOutboxtest(t, harness()) }

// TestOutboxtestSqlmock proves outboxtest's sqlmock expectations on the
// MySQL dialect (two statements for a publish with a DedupKey).
func TestOutboxtestSqlmock(t *testing.T) { dialecttest.RunSqlmockKit(t, mysql.Dialect()) }
