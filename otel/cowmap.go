package oncommitotel

import (
	"maps"
	"sync"
	"sync/atomic"
)

// cowMap is a copy-on-write map for values made once per key and then
// read by every delivery: a read is an atomic load and a map lookup,
// with no lock word the readers' cores would pass to each other; a write
// (once per key) copies the map.
type cowMap[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex // serialises writers
}

// get returns k's value, made with newV the first time.
func (c *cowMap[K, V]) get(k K, newV func() V) V {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var next map[K]V
	if old := c.m.Load(); old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
		next = maps.Clone(*old)
	} else {
		next = map[K]V{}
	}
	v := newV()
	next[k] = v
	c.m.Store(&next)
	return v
}

// all returns the map as it is now, not to be written to.
func (c *cowMap[K, V]) all() map[K]V {
	if m := c.m.Load(); m != nil {
		return *m
	}
	return nil
}
