package tcpproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo serves a line echo on the loopback until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A held reply waits in the proxy until Release, and then arrives, in order; a cut closes
// the connection and refuses new ones until Heal.
func TestHoldReleaseAndCut(t *testing.T) {
	p, err := Start(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(line string) string {
		t.Helper()
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		got, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return got[:len(got)-1]
	}
	if got := roundTrip("a"); got != "a" {
		t.Fatalf("echo through the proxy: %q", got)
	}
	p.Hold(ToClient)
	if _, err := c.Write([]byte("b\nc\n")); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		line, _ := r.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		t.Fatalf("a reply came through while held: %q", line)
	case <-time.After(50 * time.Millisecond):
	}
	p.Release(ToClient)
	if line := <-got; line != "b\n" {
		t.Fatalf("first reply after release: %q, want b", line)
	}
	if line, _ := r.ReadString('\n'); line != "c\n" {
		t.Fatalf("second reply after release: %q, want c", line)
	}
	p.Cut()
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("a cut connection still reads")
	}
	c2, err := net.Dial("tcp", p.Addr)
	if err == nil {
		c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c2.Read(make([]byte, 1)); err == nil {
			t.Fatal("a connection made while cut reads")
		}
		c2.Close()
	}
	p.Heal()
	c3, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	c, r = c3, bufio.NewReader(c3)
	if got := roundTrip("d"); got != "d" {
		t.Fatalf("echo after Heal: %q", got)
	}
}
