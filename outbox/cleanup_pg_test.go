package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// TestHealthCleanup: while a REPEATABLE READ transaction holds the MVCC
// horizon, Health.Cleanup names it (pid and state), counts its age and the
// table's dead rows, reports autovacuum off for the table, and the relay
// logs one warning naming the holder; once it ends, the holder is gone.
//
// Not parallel: another test's snapshot older than this one's would be
// the holder.
func TestHealthCleanup(t *testing.T) {
	e := newEnv(t, outbox.Config{})
	admin := pgtest.Admin(t)
	if _, err := admin.Exec(`ALTER TABLE ` + e.table + ` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	p := pool(t)
	r, err := e.ob.Relay(pgxtx.FromPool(p), fast(t, outbox.RelayConfig{Logger: logs.logger()}))
	if err != nil {
		t.Fatal(err)
	}
	outbox.WarnHorizonAfter(r, time.Second)
	rec := newRecorder()
	r.Handle("t", func(ctx context.Context, d outbox.Delivery) error { rec.add(d); return nil })
	ctx := context.Background()
	held, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	var pid int
	if _, err := held.Exec(`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	if err := held.QueryRow(`SELECT pg_backend_pid() FROM ` + e.orders + ` UNION ALL SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	start(t, r)
	publishN(t, e, p, 200, outbox.Message{Topic: "t"})
	eventually(t, 10*time.Second, "200 messages delivered", func() bool { return rec.count() == 200 })
	holder := fmt.Sprintf("pid %d (idle in transaction", pid)
	eventually(t, 15*time.Second, "Health.Cleanup naming the held transaction with the table's dead rows", func() bool {
		c := r.Health().Cleanup
		return strings.HasPrefix(c.Holder, holder) && c.HolderAge >= time.Second && c.HolderXIDs > 0 && c.DeadRows >= 200 && c.AutovacuumOff && c.LastError == nil
	})
	eventually(t, 10*time.Second, "the warning naming the holder", func() bool {
		return strings.Contains(logs.String(), "old snapshot holds back cleanup") && strings.Contains(logs.String(), holder)
	})
	if n := strings.Count(logs.String(), "old snapshot holds back cleanup"); n != 1 {
		t.Errorf("%d warnings about the holder, want 1", n)
	}
	if n := strings.Count(logs.String(), "autovacuum is off"); n != 1 {
		t.Errorf("%d warnings about autovacuum, want 1", n)
	}
	t.Logf("with the transaction held: %+v", r.Health().Cleanup)
	if err := held.Rollback(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the holder gone", func() bool {
		return !strings.HasPrefix(r.Health().Cleanup.Holder, holder)
	})
}
