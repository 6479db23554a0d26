// Package tcpproxy is a TCP proxy on the loopback for the tests and the benchmark: it forwards
// every connection it accepts to a target address, and lets the test hold what flows one way
// (a reply that has left the server but not reached the client), delay it, or cut the link,
// so that what a client does while its server's answers are late or lost can be tested
// against a real server.
package tcpproxy

import (
	"net"
	"sync"
	"time"
)

// Direction is one way through the proxy.
type Direction int

const (
	// ToServer is what the clients send.
	ToServer Direction = iota
	// ToClient is what the server answers.
	ToClient
)

// Proxy forwards connections from Addr to its target. Its zero value is not usable: make one
// with Start, and Close it.
type Proxy struct {
	// Addr is the address the proxy listens on, host:port on the loopback.
	Addr string

	target string
	ln     net.Listener

	mu      sync.Mutex
	changed *sync.Cond // broadcast when a gate opens or the proxy closes
	held    [2]bool
	delay   [2]time.Duration
	cut     bool
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// Start listens on a free loopback port and forwards every connection to target.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.changed = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Hold stops forwarding in dir: bytes that arrive wait in the proxy until Release.
func (p *Proxy) Hold(dir Direction) { p.set(func() { p.held[dir] = true }) }

// Release forwards in dir again, what was held first.
func (p *Proxy) Release(dir Direction) { p.set(func() { p.held[dir] = false }) }

// SetDelay makes every chunk of bytes that arrives in dir wait d before it is forwarded (0:
// none). Chunks keep their order.
func (p *Proxy) SetDelay(dir Direction, d time.Duration) { p.set(func() { p.delay[dir] = d }) }

// Cut closes every connection through the proxy and refuses new ones (they are accepted and
// closed at once) until Heal.
func (p *Proxy) Cut() {
	p.set(func() {
		p.cut = true
		for c := range p.conns {
			c.Close()
		}
	})
}

// Heal lets connections through again after Cut.
func (p *Proxy) Heal() { p.set(func() { p.cut = false }) }

func (p *Proxy) set(f func()) {
	p.mu.Lock()
	f()
	p.changed.Broadcast()
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.changed.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			continue
		}
		p.wg.Add(2)
		go p.pipe(server, client, ToServer)
		go p.pipe(client, server, ToClient)
	}
}

// track registers a connection's two ends; false (both closed) when the proxy closed or was
// cut meanwhile.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cut {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from src to dst, as dir's gate and delay say, until either end closes; then it
// closes both.
func (p *Proxy) pipe(dst, src net.Conn, dir Direction) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			arrived := time.Now()
			if !p.wait(dir, arrived) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait blocks a chunk that arrived in dir at arrived until its gate is open and its delay has
// run; false when the proxy closed or was cut meanwhile.
func (p *Proxy) wait(dir Direction, arrived time.Time) bool {
	p.mu.Lock()
	for p.held[dir] && !p.closed && !p.cut {
		p.changed.Wait()
	}
	ok, delay := !p.closed && !p.cut, p.delay[dir]
	p.mu.Unlock()
	if ok && delay > 0 {
		time.Sleep(time.Until(arrived.Add(delay)))
	}
	return ok
}
