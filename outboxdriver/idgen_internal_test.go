package outboxdriver

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// TestMonotonic: ids made by batches and single calls in several
// goroutines at once are all distinct, and each goroutine's come out
// increasing; a batch's are increasing too.
func TestMonotonic(t *testing.T) {
	const goroutines, rounds = 4, 300
	all := make([][]ID, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for r := range rounds {
				n := 1
				if (g+r)%2 == 0 {
					n = 100
				}
				NewIDs(n, func(_ int, id ID) { all[g] = append(all[g], id) })
			}
		})
	}
	wg.Wait()
	seen := map[ID]bool{}
	for g, ids := range all {
		for i, id := range ids {
			if seen[id] {
				t.Fatalf("id %x made twice", id)
			}
			seen[id] = true
			if i > 0 && bytes.Compare(ids[i-1][:], id[:]) >= 0 {
				t.Fatalf("goroutine %d: id %d %x not after %x", g, i, id, ids[i-1])
			}
		}
	}
}

// TestClockBack: after ids of a later millisecond, ids keep increasing
// (the clock stepping back does not reorder them).
func TestClockBack(t *testing.T) {
	var first ID
	NewIDs(1, func(_ int, id ID) { first = id })
	gen.Lock()
	gen.ms += 60_000 // as if the clock had been a minute ahead
	gen.Unlock()
	var prev ID
	NewIDs(3, func(i int, id ID) {
		if i > 0 && bytes.Compare(prev[:], id[:]) >= 0 {
			t.Errorf("id %d not after the one before", i)
		}
		prev = id
	})
	if bytes.Compare(first[:], prev[:]) >= 0 {
		t.Fatal("ids made after the clock stepped back sort before earlier ones")
	}
	var after ID
	NewIDs(1, func(_ int, id ID) { after = id })
	if bytes.Compare(prev[:], after[:]) >= 0 {
		t.Fatal("the next id sorts before the last")
	}
}

func BenchmarkNewIDs100(b *testing.B) {
	var sink ID
	for b.Loop() {
		NewIDs(100, func(_ int, id ID) { sink = id })
	}
	_ = sink
}

// TestOverflow: when the entropy of a millisecond is used up, the next
// id takes the next millisecond and still sorts after.
func TestOverflow(t *testing.T) {
	var before, after ID
	NewIDs(1, func(_ int, id ID) { before = id })
	gen.Lock()
	gen.ms += 60_000 // hold the millisecond: the clock is behind it
	gen.hi, gen.lo = 0xffff, ^uint64(0)
	ms := gen.ms
	gen.Unlock()
	NewIDs(1, func(_ int, id ID) { after = id })
	if bytes.Compare(before[:], after[:]) >= 0 {
		t.Fatal("the id after an overflow sorts before the one before it")
	}
	if got := uint64(after[0])<<40 | uint64(after[1])<<32 | uint64(after[2])<<24 | uint64(after[3])<<16 | uint64(after[4])<<8 | uint64(after[5]); got != ms+1 {
		t.Fatalf("millisecond after the overflow = %d, want %d", got, ms+1)
	}
}

// TestULIDLayout: an id's first 48 bits are the Unix milliseconds of its
// making.
func TestULIDLayout(t *testing.T) {
	t0 := time.Now().UnixMilli()
	var id ID
	NewIDs(1, func(_ int, v ID) { id = v })
	t1 := time.Now().UnixMilli()
	ms := int64(id[0])<<40 | int64(id[1])<<32 | int64(id[2])<<24 | int64(id[3])<<16 | int64(id[4])<<8 | int64(id[5])
	gen.Lock()
	last := int64(gen.ms)
	gen.Unlock()
	if ms != last || (ms < t0 && last < t0) || ms > max(t1, last) {
		t.Fatalf("id millisecond %d, made between %d and %d (generator at %d)", ms, t0, t1, last)
	}
}

func TestMakeAllocs(t *testing.T) {
	var sink ID
	if a := testing.AllocsPerRun(100, func() { NewIDs(100, func(_ int, id ID) { sink = id }) }); a != 0 {
		t.Errorf("%v allocations for 100 ids, want 0", a)
	}
	_ = sink
}
