package valkeytest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// command sends one command to addr on a fresh connection and returns the reply as text: a
// status, an integer or a bulk string (what the cluster set-up needs). An error reply is
// returned as an error. It needs no client library, so it works on nodes that are not yet
// part of a cluster.
func command(ctx context.Context, addr string, args ...string) (string, error) {
	return commands(ctx, addr, args)
}

// commands sends several commands on one connection, in order, and returns the last reply;
// the first error reply stops it. For AUTH or READONLY before the command that needs them.
func commands(ctx context.Context, addr string, cmds ...[]string) (string, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	r := bufio.NewReader(conn)
	var reply string
	for _, args := range cmds {
		if reply, err = roundTrip(conn, r, args); err != nil {
			return "", err
		}
	}
	return reply, nil
}

func roundTrip(conn net.Conn, r *bufio.Reader, args []string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("%s: %s", strings.Join(args, " "), line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := readFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("%s: unexpected reply %q", strings.Join(args, " "), line)
}

func readFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// infoField returns one field of an INFO reply, "" if absent.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
