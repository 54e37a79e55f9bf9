package dialecttest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// Gate wraps the DB of a Store so that a test can force an interleaving of
// operations: an operation run with a context from Op counts its
// statements, and one that reaches a statement chosen with ParkAfter stops
// once that statement is done (its rows closed), before its next statement
// or its transaction's commit, until the test resumes it. A statement sent
// outside a transaction (a claim, a purge batch) that is to be parked runs
// in a transaction of its own, so that it parks before its commit: the
// same effect as the single statement, held open.
type Gate struct {
	db    outbox.DB
	mu    sync.Mutex
	parks map[parkAt]*Park
}

type parkAt struct {
	op string
	n  int
}

// Park is an operation parked, or to be parked, after a statement.
type Park struct {
	reached chan struct{}
	resume  chan struct{}
	once    sync.Once
}

// NewGate wraps db.
func NewGate(db outbox.DB) *Gate { return &Gate{db: db, parks: map[parkAt]*Park{}} }

// DB returns the wrapped DB to give the operations: it is a TxDB when db
// is one.
func (g *Gate) DB() outbox.DB { return &gateDB{g: g, db: g.db} }

type opKey struct{}

type opState struct {
	name string
	n    atomic.Int32
}

// Op returns ctx labelled as one run of the operation name: its statements
// are counted from 1.
func (g *Gate) Op(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, opKey{}, &opState{name: name})
}

// ParkAfter parks the next run of op that reaches its n-th statement once
// that statement is done.
func (g *Gate) ParkAfter(op string, n int) *Park {
	p := &Park{reached: make(chan struct{}), resume: make(chan struct{})}
	g.mu.Lock()
	g.parks[parkAt{op, n}] = p
	g.mu.Unlock()
	return p
}

// Reached reports, waiting up to within, whether the operation parked.
func (p *Park) Reached(within time.Duration) bool {
	select {
	case <-p.reached:
		return true
	case <-time.After(within):
		return false
	}
}

// Resume lets the parked operation go on (at once, if it has not parked
// yet, it will not).
func (p *Park) Resume() { p.once.Do(func() { close(p.resume) }) }

// next counts a statement of ctx's operation and returns the park it must
// stop at once the statement is done, if any.
func (g *Gate) next(ctx context.Context) *Park {
	st, _ := ctx.Value(opKey{}).(*opState)
	if st == nil {
		return nil
	}
	at := parkAt{st.name, int(st.n.Add(1))}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.parks[at]
	delete(g.parks, at)
	return p
}

func (p *Park) park() {
	close(p.reached)
	<-p.resume
}

// gateDB is the wrapped pool.
type gateDB struct {
	g  *Gate
	db outbox.DB
}

func (d *gateDB) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	p := d.g.next(ctx)
	if p == nil {
		return d.db.QueryDB(ctx, q, args...)
	}
	tdb, ok := d.db.(outboxdriver.TxDB)
	if !ok {
		return nil, fmt.Errorf("dialecttest: gate: %T cannot run a transaction to park a statement in", d.db)
	}
	// Run the statement in a transaction that stays open, parked, once its
	// rows are closed, and commits when the test resumes it.
	type result struct {
		rows outboxdriver.Rows
		err  error
	}
	got := make(chan result, 1)
	closed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		sent := false
		done <- tdb.InTx(ctx, func(tx outboxdriver.DB) error {
			rows, err := tx.QueryDB(ctx, q, args...)
			got <- result{rows, err}
			sent = true
			if err != nil {
				return err
			}
			<-closed
			return nil
		})
		if !sent {
			got <- result{nil, fmt.Errorf("dialecttest: gate: the transaction did not begin")}
		}
	}()
	r := <-got
	if r.err != nil {
		<-done
		return nil, r.err
	}
	return &gateRows{Rows: r.rows, after: func() error {
		p.park()
		close(closed)
		return <-done
	}}, nil
}

func (d *gateDB) InTx(ctx context.Context, f func(tx outboxdriver.DB) error) error {
	tdb, ok := d.db.(outboxdriver.TxDB)
	if !ok {
		return fmt.Errorf("dialecttest: gate: %T cannot run a transaction", d.db)
	}
	return tdb.InTx(ctx, func(tx outboxdriver.DB) error {
		if ex, ok := tx.(outboxdriver.ExecDB); ok {
			return f(&gateExecTx{gateTx{d.g, tx}, ex})
		}
		return f(&gateTx{d.g, tx})
	})
}

// gateTx is a transaction of the wrapped pool.
type gateTx struct {
	g  *Gate
	tx outboxdriver.DB
}

func (t *gateTx) QueryDB(ctx context.Context, q string, args ...any) (outboxdriver.Rows, error) {
	p := t.g.next(ctx)
	rows, err := t.tx.QueryDB(ctx, q, args...)
	if err != nil || p == nil {
		return rows, err
	}
	return &gateRows{Rows: rows, after: func() error { p.park(); return nil }}, nil
}

// gateExecTx is a gateTx whose transaction counts changed rows.
type gateExecTx struct {
	gateTx
	ex outboxdriver.ExecDB
}

func (t *gateExecTx) ExecDB(ctx context.Context, q string, args ...any) (int64, error) {
	p := t.g.next(ctx)
	n, err := t.ex.ExecDB(ctx, q, args...)
	if p != nil {
		p.park()
	}
	return n, err
}

// gateRows runs after once, when the rows are closed.
type gateRows struct {
	outboxdriver.Rows
	after func() error
	once  sync.Once
}

func (r *gateRows) Close() error {
	err := r.Rows.Close()
	r.once.Do(func() {
		if r.after != nil {
			if e := r.after(); err == nil {
				err = e
			}
		}
	})
	return err
}

// Next closes the rows (so runs after) once they are read to the end:
// some callers read a statement's rows to the end and send the next
// statement before their deferred Close.
func (r *gateRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// runParked runs a (an operation of the gate, labelled name) in the
// background, parked after its n-th statement, and returns once it parked,
// with the function that resumes it and waits for its error. It fails t
// when a ends without reaching its n-th statement, and reports false.
func runParked(t *testing.T, g *Gate, name string, n int, a func(ctx context.Context) error) (resume func() error, ok bool) {
	t.Helper()
	p := g.ParkAfter(name, n)
	done := make(chan error, 1)
	go func() { done <- a(g.Op(context.Background(), name)) }()
	select {
	case <-p.reached:
	case err := <-done:
		p.Resume()
		if err != nil {
			t.Fatalf("%s ended before its statement %d: %v", name, n, err)
		}
		return nil, false
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not reach its statement %d", name, n)
	}
	return func() error { p.Resume(); return <-done }, true
}

// runBlocked runs b (labelled name) while another operation is parked: it
// returns b's error once b ended, or, when b is still running after
// within (waiting for a lock the parked operation holds), after resume
// has let the parked one go on and b has ended.
func runBlocked(g *Gate, name string, within time.Duration, b func(ctx context.Context) error, resume func() error) (errA, errB error, waited bool) {
	done := make(chan error, 1)
	go func() { done <- b(g.Op(context.Background(), name)) }()
	select {
	case errB = <-done:
		return resume(), errB, false
	case <-time.After(within):
		errA = resume()
		return errA, <-done, true
	}
}
