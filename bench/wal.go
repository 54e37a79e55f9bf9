package main

import (
	"context"
	"errors"
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
	resetSlot := func(ctx context.Context) {
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
	resetSlot(ctx)
	s := oncommitSystemOn(ctx, d, "oncommit-wal", "defaults with postgres.WALDialect: each message a transactional logical decoding message; one relay reads the slot (pgoutput), writes nothing on success", outbox.Config{}, outbox.RelayConfig{})
	truncate := s.reset
	s.reset = func(ctx context.Context) {
		truncate(ctx)
		resetSlot(ctx)
	}
	return s
}
