package oncommitotel_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/internal/pgtest"
	oncommitotel "github.com/oncommit/oncommit/otel"
	"github.com/oncommit/oncommit/outbox"
)

// TestObserveCleanup: while a REPEATABLE READ transaction holds the MVCC
// horizon, the cleanup gauges report the table's dead rows and a horizon
// age above zero.
func TestObserveCleanup(t *testing.T) {
	url := pgtest.URL(t)
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	table := "otelclean_" + hex.EncodeToString(b[:])
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := postgres.Migrate(ctx, db, table); err != nil {
		t.Fatal(err)
	}
	defer db.Exec(`DROP TABLE ` + table + `, ` + table + `_keys`)
	held, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	var n int
	if err := held.QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(postgres.Dialect(), outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: noop.NewTracerProvider(), MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(pgxtx.FromStdlib(db), outbox.RelayConfig{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Handle("t", func(context.Context, outbox.Delivery) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := tel.ObserveCleanup(r); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(rctx)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var dead int64
	var age float64
	deadline := time.Now().Add(20 * time.Second)
	for (dead < 50 || age <= 0) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch m.Name {
				case oncommitotel.MetricTableDeadRows:
					for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
						dead = dp.Value
					}
				case oncommitotel.MetricTableHorizonAge:
					for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
						age = dp.Value
					}
				}
			}
		}
	}
	if dead < 50 || age <= 0 {
		t.Fatalf("gauges: dead rows %d (want >= 50), horizon age %v (want > 0); health %+v", dead, age, r.Health().Cleanup)
	}
}
