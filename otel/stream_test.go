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

// TestObserveStream: while a relay of the WAL transport reads the slot and
// a handler holds a message, the stream gauges report a lag and an age
// above zero; once it is settled, an age of 0; a relay that does not read
// the slot reports nothing.
func TestObserveStream(t *testing.T) {
	url := pgtest.WALURL(t)
	ctx := context.Background()
	var b [5]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	table := "otelwal_" + sfx
	cfg := postgres.WALConfig{ConnString: url, Slot: "s_" + sfx, Publication: "p_" + sfx}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := postgres.Migrate(ctx, db, table); err != nil {
		t.Fatal(err)
	}
	defer db.Exec(`DROP TABLE ` + table + `, ` + table + `_keys`)
	if err := postgres.SetupWAL(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for range 100 {
			if postgres.DropWAL(ctx, cfg) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	d, err := postgres.WALDialect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(d, outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	tel, err := oncommitotel.New(oncommitotel.Config{TracerProvider: noop.NewTracerProvider(), MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ob.Relay(pgxtx.FromStdlib(db), outbox.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	if err := r.Handle("t", func(context.Context, outbox.Delivery) error {
		started <- struct{}{}
		<-release
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := tel.ObserveStream(r); err != nil {
		t.Fatal(err)
	}
	gauges := func() (lag int64, age float64, ok bool) {
		ms := telemetry{reader: reader}.metrics(t)
		l, ok1 := ms[oncommitotel.MetricStreamLag]
		a, ok2 := ms[oncommitotel.MetricStreamOldestAge]
		if !ok1 || !ok2 {
			return 0, 0, false
		}
		lg := l.Data.(metricdata.Gauge[int64]).DataPoints
		ag := a.Data.(metricdata.Gauge[float64]).DataPoints
		if len(lg) != 1 || len(ag) != 1 {
			return 0, 0, false
		}
		return lg[0].Value, ag[0].Value, true
	}
	if _, _, ok := gauges(); ok {
		t.Fatal("stream gauges reported before the relay reads the slot")
	}
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(runCtx) }()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Publish(ctx, sqltx.From(tx), outbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	<-started
	time.Sleep(50 * time.Millisecond)
	lag, age, ok := gauges()
	if !ok || lag <= 0 || age <= 0 {
		t.Errorf("while a message is held: lag %d bytes, age %.3fs, reported %v; want both above 0", lag, age, ok)
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, age, ok := gauges(); ok && age == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the age did not fall to 0 once the message was settled")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}
