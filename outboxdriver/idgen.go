package outboxdriver

// The process's id generator: ULIDs (48 bits of Unix milliseconds, then 80
// bits of randomness, big-endian), monotonic across every goroutine of the
// process, a batch of them under one lock and one clock read.

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"sync"
	"time"
)

var gen struct {
	sync.Mutex
	ms     uint64 // the millisecond of the last id made
	hi     uint16 // its top 16 bits of entropy
	lo     uint64 // its low 64 bits of entropy
	seeded bool
}

// NewIDs makes n new IDs and gives the i-th to set, in increasing order,
// under one lock and one clock read (a batch's ids cost a few nanoseconds
// each); [NewID] makes one. Every id made in the process is greater than
// every id made before it, even when the clock steps back. The first id of a millisecond has fresh
// random entropy (math/rand/v2's generator, seeded from the system's
// randomness: another process's ids start elsewhere); each next id of
// that millisecond is the one before plus a random increment of 1 to
// 2^32, as oklog/ulid's monotonic entropy does; when the 80 bits would
// overflow, the next ids take the next millisecond.
func NewIDs(n int, set func(i int, id ID)) {
	gen.Lock()
	defer gen.Unlock()
	now := uint64(time.Now().UnixMilli())
	for i := range n {
		switch {
		case !gen.seeded || now > gen.ms:
			gen.ms, gen.hi, gen.lo, gen.seeded = now, uint16(rand.Uint32()), rand.Uint64(), true
		default: // the same millisecond, or the clock stepped back
			lo, carry := bits.Add64(gen.lo, uint64(rand.Uint32())+1, 0)
			if carry == 1 && gen.hi == 0xffff {
				gen.ms++
				gen.hi, gen.lo = uint16(rand.Uint32()), rand.Uint64()
				break
			}
			gen.hi += uint16(carry)
			gen.lo = lo
		}
		var id ID
		binary.BigEndian.PutUint16(id[0:2], uint16(gen.ms>>32))
		binary.BigEndian.PutUint32(id[2:6], uint32(gen.ms))
		binary.BigEndian.PutUint16(id[6:8], gen.hi)
		binary.BigEndian.PutUint64(id[8:16], gen.lo)
		set(i, id)
	}
}
