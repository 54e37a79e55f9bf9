package fwdtest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a server that a test can cut: Cut
// closes every connection through it and refuses new ones (accepted, then
// closed at once) until Restore.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
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
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
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

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
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

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

func (p *Proxy) close() {
	p.Cut()
	p.ln.Close()
	p.wg.Wait()
}
