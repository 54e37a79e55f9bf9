package mysql_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/mysql"
	"github.com/oncommit/oncommit/dialect/mysql/internal/mysqltest"
	"github.com/oncommit/oncommit/outbox"
)

// TestInboxThreeWaiters pins what docs/guide.md says of MySQL/MariaDB: when
// two transactions wait to record an id a third recorded, and the third
// rolls back, one waiter records it (new) and the other sees a repeat or
// loses a deadlock (ErrRetryTx, its transaction rolled back by InnoDB);
// never both new, never both lost.
func TestInboxThreeWaiters(t *testing.T) {
	e := newEnv(t, nil, outbox.Config{})
	if err := mysql.MigrateInbox(context.Background(), mysqltest.Admin(t), e.db+".inbox"); err != nil {
		t.Fatal(err)
	}
	ib, err := outbox.NewInbox(mysql.Dialect(), outbox.InboxConfig{Table: e.db + ".inbox"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := e.begin(t)
	if fresh, err := ib.Record(ctx, sqltx.From(first), "c", "m-1"); err != nil || !fresh {
		t.Fatalf("first: %v %v", fresh, err)
	}
	type answer struct {
		fresh bool
		err   error
	}
	got := make(chan answer, 2)
	for range 2 {
		go func() {
			tx := e.begin(t)
			fresh, err := ib.Record(ctx, sqltx.From(tx), "c", "m-1")
			if err == nil {
				time.Sleep(100 * time.Millisecond) // hold the lock a while
				err = tx.Commit()
			}
			got <- answer{fresh, err}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := first.Rollback(); err != nil {
		t.Fatal(err)
	}
	a, b := <-got, <-got
	fresh, deadlocks := 0, 0
	for _, x := range []answer{a, b} {
		switch {
		case x.err == nil && x.fresh:
			fresh++
		case x.err == nil:
		case errors.Is(x.err, outbox.ErrRetryTx):
			deadlocks++
		default:
			t.Fatalf("waiter: %v", x.err)
		}
	}
	if fresh != 1 {
		t.Fatalf("answers %+v %+v: want exactly one new", a, b)
	}
	t.Logf("waiters: one new, %d deadlock(s) reported as ErrRetryTx", deadlocks)
	if n := count(t, e.db+".inbox", ""); n != 1 {
		t.Fatalf("%d rows", n)
	}
}
