package fwdtest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy in front of a server that a test can cut or stall:
// Cut closes every connection through it and refuses new ones (accepted,
// then closed at once) until Restore; Stall keeps every connection open
// and accepts new ones but passes no byte either way until Restore (a
// network that drops packets without resetting connections).
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	flow  chan struct{} // closed while bytes pass; open while stalled
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on a free port of 127.0.0.1 and forwards to target,
// until t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, flow: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.flow)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, s) {
			continue
		}
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

// track registers a connection pair, or closes it when the proxy went
// down meanwhile.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		if p.down {
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
	}
	return !p.down
}

// pipe copies src to dst, holding each read while the proxy is stalled.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			flow := p.flow
			p.mu.Unlock()
			<-flow
			if _, err := dst.Write(buf[:n]); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// Stall stops passing bytes, and leaves every connection open.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flow:
		p.flow = make(chan struct{})
	default: // stalled already
	}
}

// CutFault is the fault Cut makes, for Outage: every connection cut,
// new ones refused, for 10 s.
func (p *Proxy) CutFault() Fault {
	return Fault{Down: p.Cut, Up: p.Restore, Grace: 2 * time.Second}
}

// StallFault is the fault Stall makes, for Outage: every connection open
// and passing nothing, for 15 s (longer than the forwarders' default ack
// timeouts, 10 s).
func (p *Proxy) StallFault() Fault {
	return Fault{Down: p.Stall, Up: p.Restore, For: 15 * time.Second, Grace: 2 * time.Second}
}

// Restore lets connections and bytes through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
	p.unstall()
}

// unstall lets bytes through; p.mu is held.
func (p *Proxy) unstall() {
	select {
	case <-p.flow:
	default:
		close(p.flow)
	}
}

func (p *Proxy) close() {
	p.Cut()
	p.mu.Lock()
	p.unstall() // a pipe held by a stall writes to its closed connection and ends
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
