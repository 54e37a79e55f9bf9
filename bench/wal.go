package main

import (
	"context"
	"errors"
	"flag"
	"sync/atomic"
	"time"

	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

// walSystem is oncommit with the WAL transport (postgres.WALDialect) on a
// table of its own and the slot and publication bench_wal, on the server
// of -url, which needs wal_level = logical: run the compare scenario
// against such a server with -systems naming oncommit-wal, e.g.
//
//	cd bench && go run . -only compare -url postgres://postgres@127.0.0.1:5433/test?sslmode=disable \
//	  -systems oncommit,oncommit-wal -scenarios publish-8,publish-100,drain-1,latency -rounds 5
//
// Its reset also drops and recreates the slot, so that no round reads
// another's messages; its backlog (fill) is published through the WAL.
func walSystem(ctx context.Context) *system {
	cfg := postgres.WALConfig{ConnString: *url, Slot: "bench_wal", Publication: "bench_wal"}
	d, err := postgres.WALDialect(cfg)
	check(err)
	resetSlot := func(ctx context.Context) { resetWAL(ctx, cfg) }
	resetSlot(ctx)
	s := oncommitSystemOn(ctx, d, "oncommit-wal", "defaults with postgres.WALDialect: each message a transactional logical decoding message; one relay reads the slot (pgoutput), writes nothing on success", outbox.Config{}, outbox.RelayConfig{})
	truncate := s.reset
	s.reset = func(ctx context.Context) {
		truncate(ctx)
		resetSlot(ctx)
	}
	return s
}

// resetWAL drops the slot and publication of cfg and makes them again:
// nothing published before is read.
func resetWAL(ctx context.Context, cfg postgres.WALConfig) {
	for i := 0; ; i++ { // a relay just stopped: the server frees its slot shortly after
		err := postgres.DropWAL(ctx, cfg)
		if err == nil {
			break
		}
		if i == 100 {
			check(errors.Join(errors.New("bench: cannot drop the WAL slot"), err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	check(postgres.SetupWAL(ctx, cfg))
}

var walBytesN = flag.Int("wal-bytes-n", 5000, "compare: messages of the wal-bytes scenario")

// walBytesRun is the WAL the server writes per message over its whole
// life: n messages published one per transaction by one producer, then
// delivered by one relay (no-op handler) with every outcome written,
// measured as the advance of pg_current_wal_lsn() from before the first
// publish to after the relay stopped, divided by n. Nothing else may write
// to the server meanwhile.
func walBytesRun(ctx context.Context, s *system, n int) float64 {
	s.reset(ctx)
	lsn := func() int64 {
		var b int64
		check(s.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&b))
		return b
	}
	start := lsn()
	for range n {
		tx, err := s.pool.Begin(ctx)
		check(err)
		check(s.publish(ctx, tx, 1, 0))
		check(tx.Commit(ctx))
	}
	var k atomic.Int64
	onMsg, done := untilHandled(n, func(int64) { k.Add(1) })
	run, stop := s.consume(ctx, 1, onMsg)
	run()
	<-done
	stop()
	closePools()
	if left := s.left(ctx); left != 0 {
		check(errors.New("bench: wal-bytes: messages left after the drain"))
	}
	return float64(lsn()-start) / float64(n)
}
