package postgres

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/outbox"
)

// TestWALServerCrash crash-restarts a throwaway server with
// wal_level=logical (pg_ctl stop -m immediate) while publishers commit
// messages through the WAL transport, some abandon their transaction by
// closing the connection mid-transaction, and a relay reads the slot with
// 3% of first deliveries failing into the table. After the restart every
// committed message is delivered (lost 0), none of an abandoned or
// refused transaction is (unexpected 0), and every message delivered
// twice was committed before the crash: duplicates come only from the
// slot position the server had not yet made durable (a logical slot's
// position is written at checkpoints), none from what follows the
// restart.
func TestWALServerCrash(t *testing.T) {
	bin := pgBin(t)
	srv := startThrowaway(t, bin, "wal_level=logical", "max_replication_slots=4", "max_wal_senders=4")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db, err := sql.Open("pgx", srv.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE SCHEMA app`); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, db, "app.outbox"); err != nil {
		t.Fatal(err)
	}
	cfg := WALConfig{ConnString: srv.url}
	if err := SetupWAL(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	d, err := WALDialect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(d, outbox.Config{Table: "app.outbox"})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	committed := map[outbox.ID]bool{} // false: the commit's outcome is unknown
	abandoned := map[outbox.ID]bool{}
	success := map[outbox.ID]int{}
	afterRestart := map[outbox.ID]bool{} // committed after the restart
	var restarted atomic.Bool
	var delivered atomic.Int64
	crash := make(chan struct{})
	r, err := ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{
		PollInterval: 50 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryCap: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("t", func(_ context.Context, d outbox.Delivery) error {
		if d.Attempt == 1 && d.ID[15]%33 == 0 {
			return errors.New("first delivery fails")
		}
		mu.Lock()
		success[d.ID]++
		mu.Unlock()
		if delivered.Add(1) == 1500 {
			close(crash)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rctx, cancelRelay := context.WithCancel(ctx)
	defer cancelRelay()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(rctx) }()

	pctx, stopPublishers := context.WithCancel(ctx)
	var pubs sync.WaitGroup
	for p := range 4 {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			for pctx.Err() == nil {
				if err := publishOnce(pctx, pool, ob, rng, &mu, &restarted, committed, afterRestart, abandoned); err != nil {
					time.Sleep(20 * time.Millisecond) // the server is down
				}
			}
		}()
	}

	<-crash
	srv.ctl(t, "stop", "-m", "immediate")
	time.Sleep(500 * time.Millisecond)
	srv.ctl(t, "start", "-w", "-l", filepath.Join(srv.dir, "log"), "-o", srv.opts)
	restarted.Store(true)
	time.Sleep(2 * time.Second) // publishing and delivering again
	stopPublishers()
	pubs.Wait()

	deadline := time.Now().Add(90 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for id, sure := range committed {
			if sure && success[id] == 0 {
				missing++
			}
		}
		mu.Unlock()
		var left int
		err := db.QueryRow(`SELECT count(*) FROM app.outbox`).Scan(&left)
		if missing == 0 && err == nil && left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90 s: %d committed messages not delivered, %d rows left (%v)", missing, left, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancelRelay()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	sure, twice := 0, 0
	for _, ok := range committed {
		if ok {
			sure++
		}
	}
	for id, n := range success {
		if _, ok := committed[id]; !ok {
			t.Errorf("delivered %v, of a transaction that was abandoned or refused (abandoned: %v)", id, abandoned[id])
		}
		if n > 1 {
			twice++
			if afterRestart[id] {
				t.Errorf("message %v, committed after the restart, delivered %d times", id, n)
			}
		}
	}
	t.Logf("%d messages committed (%d more of unknown outcome, %d after the restart), %d abandoned mid-transaction; server crash-restarted after 1,500 deliveries: lost 0, unexpected 0, delivered more than once %d (all committed before the crash)",
		sure, len(committed)-sure, len(afterRestart), len(abandoned), twice)
}

// publishOnce publishes one to three messages in a transaction and
// commits it, or (one time in twenty) closes the connection mid-transaction
// as a killed publisher would; it records the ids in committed (true once
// the commit returned, false when its outcome is unknown) or abandoned,
// and in after those committed once restarted was true.
func publishOnce(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, rng *rand.Rand, mu *sync.Mutex, restarted *atomic.Bool, committed, after, abandoned map[outbox.ID]bool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	msgs := make([]outbox.Message, 1+rng.IntN(3))
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "t", Payload: []byte(`{}`)}
	}
	res, err := ob.PublishBatch(ctx, pgxtx.From(tx), msgs)
	if err != nil {
		_ = tx.Rollback(context.Background())
		return err
	}
	if rng.IntN(20) == 0 {
		_ = conn.Conn().PgConn().Conn().Close() // the socket, mid-transaction
		mu.Lock()
		for _, r := range res {
			abandoned[r.ID] = true
		}
		mu.Unlock()
		return nil
	}
	late := restarted.Load()
	err = tx.Commit(context.Background())
	mu.Lock()
	defer mu.Unlock()
	for _, r := range res {
		switch {
		case err == nil:
			committed[r.ID] = true
			if late {
				after[r.ID] = true
			}
		case !errors.Is(err, context.Canceled):
			committed[r.ID] = false // a commit whose answer was lost may have happened
		}
	}
	return err
}
