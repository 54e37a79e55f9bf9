package sqlbuild

import (
	"sync"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Texts caches statement texts that a dialect builds from a table: they
// are the same on every call, and the relay asks for them on every claim,
// settle and renewal.
type Texts[V any] struct {
	build func(outboxdriver.Table) V
	mu    sync.RWMutex
	m     map[outboxdriver.Table]V
}

// NewTexts returns a cache of build's results.
func NewTexts[V any](build func(outboxdriver.Table) V) *Texts[V] {
	return &Texts[V]{build: build, m: map[outboxdriver.Table]V{}}
}

// Get returns build(t), built once per table.
func (c *Texts[V]) Get(t outboxdriver.Table) V {
	c.mu.RLock()
	v, ok := c.m[t]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = c.build(t)
	c.mu.Lock()
	c.m[t] = v
	c.mu.Unlock()
	return v
}
