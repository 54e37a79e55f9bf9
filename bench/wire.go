package main

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// wireCounter is a pgx tracer counting what the pools of the compare and
// cost scenarios send: round trips (a query, a batch, a COPY, a prepare
// each) and statements (a batch counts its queries; BEGIN and COMMIT count).
type wireCounter struct {
	roundTrips, statements atomic.Int64
}

var wire = &wireCounter{}

func (w *wireCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	w.roundTrips.Add(1)
	w.statements.Add(1)
	return ctx
}

func (w *wireCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (w *wireCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	w.roundTrips.Add(1)
	return ctx
}

func (w *wireCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	w.statements.Add(1)
}

func (w *wireCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (w *wireCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	w.roundTrips.Add(1)
	w.statements.Add(1)
	return ctx
}

func (w *wireCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

func (w *wireCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	w.roundTrips.Add(1)
	return ctx
}

func (w *wireCounter) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// snapshot returns the counts so far.
func (w *wireCounter) snapshot() (roundTrips, statements int64) {
	return w.roundTrips.Load(), w.statements.Load()
}
