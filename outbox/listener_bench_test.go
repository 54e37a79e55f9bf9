package outbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/internal/pgtest"
	"github.com/oncommit/oncommit/outbox"
)

// BenchmarkWakeAfterReconnect cuts the relay's listener connection 8 times,
// 3 s apart (pg_terminate_backend), and after each reconnect publishes 10
// messages, 50 ms apart, one per transaction, during the first second. The
// poll interval is a minute, so only the NOTIFY delivers them in time. It
// reports the commit-to-handler latency (p50 over all cuts, and the worst
// cut's p50) and the longest time from a cut to LISTEN in force again:
//
//	go test ./outbox -run '^$' -bench WakeAfterReconnect -benchtime 1x
func BenchmarkWakeAfterReconnect(b *testing.B) {
	for range b.N {
		e := newEnv(b, outbox.Config{})
		r, err := e.ob.Relay(pgxtx.FromPool(pool(b)), fast(b, outbox.RelayConfig{PollInterval: time.Minute}))
		if err != nil {
			b.Fatal(err)
		}
		var mu sync.Mutex
		handled := map[outbox.ID]time.Time{}
		r.Handle("t", func(_ context.Context, d outbox.Delivery) error {
			mu.Lock()
			handled[d.ID] = time.Now()
			mu.Unlock()
			return nil
		})
		run := start(b, r)
		p := pool(b)
		for r.Health().Listener != outbox.ListenerListening {
			time.Sleep(time.Millisecond)
		}
		var all, cutP50 []time.Duration
		var reconnectMax time.Duration
		for i := 1; i <= 8; i++ {
			cut := time.Now()
			if _, err := pgtest.Admin(b).Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'oncommit-listener' AND query LIKE '%` + e.schema + `%'`); err != nil {
				b.Fatal(err)
			}
			for r.Health().ListenerConnects < i+1 {
				if time.Since(cut) > 10*time.Second {
					b.Fatalf("cut %d: no reconnect in 10s", i)
				}
				time.Sleep(time.Millisecond)
			}
			back := time.Now()
			reconnectMax = max(reconnectMax, back.Sub(cut))
			var lat []time.Duration
			for range 10 {
				ids := publishN(b, e, p, 1, outbox.Message{Topic: "t"})
				committed := time.Now()
				for {
					mu.Lock()
					at, ok := handled[ids[0]]
					mu.Unlock()
					if ok {
						lat = append(lat, max(at.Sub(committed), 0))
						break
					}
					if time.Since(committed) > 5*time.Second {
						b.Fatalf("cut %d: a message was not woken for 5s", i)
					}
					time.Sleep(100 * time.Microsecond)
				}
				time.Sleep(50 * time.Millisecond)
			}
			slices.Sort(lat)
			cutP50 = append(cutP50, lat[len(lat)/2])
			all = append(all, lat...)
			time.Sleep(time.Until(cut.Add(3 * time.Second)))
		}
		run.stop(b)
		slices.Sort(all)
		slices.Sort(cutP50)
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(cutP50[len(cutP50)-1].Microseconds())/1000, "worst-cut-p50-ms")
		b.ReportMetric(float64(reconnectMax.Microseconds())/1000, "max-reconnect-ms")
	}
}
