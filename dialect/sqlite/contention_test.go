package sqlite_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
)

// BenchmarkContention measures what sustained write contention does to
// publishers and relays on one SQLite file: two replicas, each a *sql.DB
// with four publishers in tight loops (begin, publish, commit) and a relay
// (Lease sqlite.MinLease, 15 s, or OUTBOX_SQLITE_LEASE, which the relay
// refuses below it; one message in ten has a handler that
// runs half the lease, past a third of it, so its lease is renewed). It
// reports, per run, the
// publishes that committed and the SQLITE_BUSY errors that reached each
// caller: publishers (begin, Publish or commit), and the relays' claims,
// settles and renewals (counted from their log), with the lost-lease and
// fenced-off warnings the relays logged and the deliveries beyond one per
// message. One run lasts OUTBOX_SQLITE_CONTENTION (default 20s); the DSN's
// options are OUTBOX_SQLITE_DSN's (default the recommended ones):
//
//	go test ./dialect/sqlite -run '^$' -bench Contention -benchtime 1x
func BenchmarkContention(b *testing.B) {
	run := envDuration(b, "OUTBOX_SQLITE_CONTENTION", 20*time.Second)
	lease := envDuration(b, "OUTBOX_SQLITE_LEASE", sqlite.MinLease)
	dsn := recommendedDSN
	if v := os.Getenv("OUTBOX_SQLITE_DSN"); v != "" {
		dsn = v
	}
	for range b.N {
		c := contend(b, dsn, run, lease)
		b.ReportMetric(float64(c.published.Load()), "published")
		b.ReportMetric(float64(c.publishBusy.Load()), "busy-publish")
		b.ReportMetric(float64(c.claimBusy.Load()), "busy-claim")
		b.ReportMetric(float64(c.settleBusy.Load()), "busy-settle")
		b.ReportMetric(float64(c.renewBusy.Load()), "busy-renew")
		b.ReportMetric(float64(c.otherErrors.Load()), "other-errors")
		b.ReportMetric(float64(c.lostLeases.Load()), "lost-leases")
		b.ReportMetric(float64(c.fencedOff.Load()), "fenced-off")
		b.ReportMetric(float64(c.delivered.Load()), "delivered")
		b.ReportMetric(float64(c.extra.Load()), "extra-deliveries")
	}
}

// envDuration reads the duration in the environment variable name, def
// when it is not set.
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return d
}

// contention counts what one run of BenchmarkContention met.
type contention struct {
	published, publishBusy                        atomic.Int64
	claimBusy, settleBusy, renewBusy, otherErrors atomic.Int64
	lostLeases, fencedOff, delivered, extra       atomic.Int64
}

// isBusy reports SQLITE_BUSY by its result code.
func isBusy(err error) bool {
	var coded interface{ Code() int }
	return errors.As(err, &coded) && coded.Code()&0xff == 5
}

// countingHandler counts the relay's log records of interest.
type countingHandler struct {
	c   *contention
	log *testing.B
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countingHandler) WithGroup(string) slog.Handler            { return h }

func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	var err error
	n := int64(1)
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "err":
			err, _ = a.Value.Any().(error)
		case "count":
			n = a.Value.Int64()
		}
		return true
	})
	switch msg := r.Message; {
	case strings.HasPrefix(msg, "outbox: lease lost"):
		h.c.lostLeases.Add(1)
	case strings.HasPrefix(msg, "outbox: shutdown grace period over"):
		// expected at the end of a run: long handlers outlive the grace
	case strings.HasPrefix(msg, "outbox: settles fenced off"):
		h.c.fencedOff.Add(n)
	case err != nil && isBusy(err) && strings.HasPrefix(msg, "outbox: claim failed"):
		h.c.claimBusy.Add(1)
	case err != nil && isBusy(err) && strings.HasPrefix(msg, "outbox: settle failed"):
		h.c.settleBusy.Add(1)
	case err != nil && isBusy(err) && strings.HasPrefix(msg, "outbox: lease renewal failed"):
		h.c.renewBusy.Add(1)
	case r.Level >= slog.LevelWarn:
		h.c.otherErrors.Add(1)
		h.log.Logf("%s %s %v", r.Level, msg, err)
	}
	return nil
}

func contend(b *testing.B, dsn string, run, lease time.Duration) *contention {
	c := &contention{}
	path := filepath.Join(b.TempDir(), "contention.db")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen sync.Map // outbox.ID -> *atomic.Int32
	var wg sync.WaitGroup
	stop := time.Now().Add(run)
	for range 2 {
		db := openFile(b, path, dsn)
		ob, err := outbox.New(sqlite.Dialect(), outbox.Config{})
		if err != nil {
			b.Fatal(err)
		}
		r, err := ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{Lease: lease, Logger: slog.New(countingHandler{c, b})})
		if err != nil {
			b.Fatal(err)
		}
		r.Handle("t", func(ctx context.Context, d outbox.Delivery) error {
			n, _ := seen.LoadOrStore(d.ID, new(atomic.Int32))
			if n.(*atomic.Int32).Add(1) > 1 {
				c.extra.Add(1)
			}
			c.delivered.Add(1)
			if d.ID.Time().UnixMilli()%10 == 0 { // about one in ten: a long handler
				select {
				case <-time.After(lease / 2):
				case <-ctx.Done():
				}
			}
			return nil
		})
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				b.Error(err)
			}
		})
		for range 4 {
			wg.Go(func() {
				msg := outbox.Message{Topic: "t", Payload: []byte(`{"n":1}`)}
				ctx := context.Background() // publishers stop at the end of the run, not on cancel
				for time.Now().Before(stop) {
					err := func() error {
						tx, err := db.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						defer tx.Rollback()
						if _, err := ob.Publish(ctx, sqltx.From(tx), msg); err != nil {
							return err
						}
						return tx.Commit()
					}()
					switch {
					case err == nil:
						c.published.Add(1)
					case isBusy(err):
						c.publishBusy.Add(1)
					default:
						b.Error(err)
						return
					}
				}
			})
		}
	}
	time.Sleep(time.Until(stop))
	cancel()
	wg.Wait()
	return c
}
