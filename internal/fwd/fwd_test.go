package fwd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
)

// fake is a broker whose answers the test scripts: answer[i] is the
// outcome of ds[i]'s publish (a nil error confirms it), and hang[i] never
// answers.
type fake struct {
	answer    map[int]error
	hang      map[int]bool
	refuse    map[int]error
	inflight  int
	maxFlight int
	keyFlight map[string]int
	maxPerKey int
	published []int
	ds        []outbox.Delivery
}

func (f *fake) start(i int) (Wait, error) {
	if err := f.refuse[i]; err != nil {
		return nil, err
	}
	f.published = append(f.published, i)
	f.inflight++
	f.maxFlight = max(f.maxFlight, f.inflight)
	k := f.ds[i].Key
	if k != "" {
		f.keyFlight[k]++
		f.maxPerKey = max(f.maxPerKey, f.keyFlight[k])
	}
	return func(done <-chan struct{}, timeout <-chan time.Time) error {
		defer func() {
			f.inflight--
			if k != "" {
				f.keyFlight[k]--
			}
		}()
		if f.hang[i] {
			select {
			case <-done:
				return context.Canceled
			case <-timeout:
				return ErrAckTimeout
			}
		}
		return f.answer[i]
	}, nil
}

func TestBatch(t *testing.T) {
	boom := errors.New("boom")
	keys := func(ks ...string) []outbox.Delivery {
		ds := make([]outbox.Delivery, len(ks))
		for i, k := range ks {
			ds[i].Key = k
		}
		return ds
	}
	for _, c := range []struct {
		name      string
		ds        []outbox.Delivery
		window    int
		f         fake
		want      []error
		published []int
		maxFlight int
	}{
		{name: "all confirmed, window bounds the unanswered", ds: keys("", "", "", "", ""), window: 2,
			want: []error{nil, nil, nil, nil, nil}, published: []int{0, 1, 2, 3, 4}, maxFlight: 2},
		{name: "one nacked", ds: keys("", "", ""), window: 8, f: fake{answer: map[int]error{1: boom}},
			want: []error{nil, boom, nil}, published: []int{0, 1, 2}, maxFlight: 3},
		{name: "one refused at publish", ds: keys("", "", ""), window: 8, f: fake{refuse: map[int]error{1: boom}},
			want: []error{nil, boom, nil}, published: []int{0, 2}, maxFlight: 2},
		{name: "a key's failure holds its later messages", ds: keys("a", "b", "a", "a", "b"), window: 8, f: fake{answer: map[int]error{0: boom}},
			want: []error{boom, nil, ErrKeyFailed, ErrKeyFailed, nil}, published: []int{0, 1, 4}, maxFlight: 2},
		{name: "a refused publish holds its key", ds: keys("a", "a", ""), window: 8, f: fake{refuse: map[int]error{0: boom}},
			want: []error{boom, ErrKeyFailed, nil}, published: []int{2}, maxFlight: 1},
		{name: "no answer is a timeout", ds: keys("", "a", "a"), window: 8, f: fake{hang: map[int]bool{1: true}},
			want: []error{nil, ErrAckTimeout, ErrKeyFailed}, published: []int{0, 1}, maxFlight: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := c.f
			f.ds, f.keyFlight = c.ds, map[string]int{}
			got := Batch(context.Background(), c.ds, c.window, 20*time.Millisecond, f.start)
			if len(got) != len(c.want) {
				t.Fatalf("%d outcomes, want %d", len(got), len(c.want))
			}
			for i := range got {
				if !errors.Is(got[i], c.want[i]) || (got[i] == nil) != (c.want[i] == nil) {
					t.Errorf("outcome %d: %v, want %v", i, got[i], c.want[i])
				}
			}
			if len(f.published) != len(c.published) {
				t.Errorf("published %v, want %v", f.published, c.published)
			} else {
				for i := range f.published {
					if f.published[i] != c.published[i] {
						t.Errorf("published %v, want %v", f.published, c.published)
						break
					}
				}
			}
			if f.maxFlight != c.maxFlight {
				t.Errorf("at most %d unanswered at once, want %d", f.maxFlight, c.maxFlight)
			}
			if f.maxPerKey > 1 {
				t.Errorf("%d unanswered publishes of one key at once, want at most 1", f.maxPerKey)
			}
		})
	}
}

func TestBatchCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f := fake{ds: make([]outbox.Delivery, 3), keyFlight: map[string]int{}}
	for i, err := range Batch(ctx, f.ds, 8, time.Second, f.start) {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("outcome %d: %v, want context.Canceled", i, err)
		}
	}
	if len(f.published) != 0 {
		t.Errorf("published %v after the context ended", f.published)
	}
}
