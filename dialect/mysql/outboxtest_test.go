package mysql_test

import (
	"testing"

	"github.com/oncommit/oncommit/internal/dialecttest"
)

// TestOutboxtest proves outboxtest.Drain and outboxtest.Published on
// MySQL/MariaDB.
func TestOutboxtest(t *testing.T) { dialecttest.RunOutboxtest(t, harness()) }
