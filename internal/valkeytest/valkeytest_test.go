package valkeytest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

func TestStartBinaryStopsEverythingOnClose(t *testing.T) {
	if FindBinary() == "" {
		t.Fatal("this test needs valkey-server or redis-server on PATH: " + ErrNoServer.Error())
	}
	ctx := context.Background()
	s, err := Start(ctx, OwnServer())
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, s.Addr); err != nil {
		t.Fatalf("started server does not answer: %v", err)
	}
	dir := s.proc.dir
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, s.Addr); err == nil {
		t.Fatal("server still answers after Close")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp dir %s still there after Close: %v", dir, err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestStopAndRestartKeepTheAddress(t *testing.T) {
	s := New(t, OwnServer())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := s.Addr
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, addr); err == nil {
		t.Fatal("server answers after Stop")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, addr); err != nil || s.Addr != addr {
		t.Fatalf("after Restart: ping %v, addr %s (was %s)", err, s.Addr, addr)
	}
}

func TestEnvAddrIsUsedAsIs(t *testing.T) {
	own := New(t, OwnServer())
	t.Setenv(EnvAddr, own.Addr)
	s, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr != own.Addr || s.Source != "env" {
		t.Fatalf("Start with %s set: addr %s source %s, want %s env", EnvAddr, s.Addr, s.Source, own.Addr)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ping(context.Background(), own.Addr); err != nil {
		t.Fatalf("closing an env server must not stop it: %v", err)
	}
	if err := s.Stop(); err == nil {
		t.Fatal("Stop of a server Start did not launch should fail")
	}
}

func TestNoServerSaysHowToGetOne(t *testing.T) {
	t.Setenv(EnvAddr, "")
	t.Setenv("PATH", t.TempDir())
	t.Setenv("DOCKER_HOST", "unix://"+t.TempDir()+"/no-docker.sock")
	_, err := Start(context.Background())
	if !errors.Is(err, ErrNoServer) {
		t.Fatalf("Start with nothing available: %v, want ErrNoServer", err)
	}
}

func TestParseInfo(t *testing.T) {
	info := ParseInfo("txt:# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n\r\n# Commandstats\r\n" +
		"cmdstat_evalsha:calls=10,usec=150,usec_per_call=15.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|list:calls=2,usec=9.5,usec_per_call=4.75\r\nused_cpu_sys:1.25\r\n")
	if info["role"] != "slave" || info["master_link_status"] != "up" || info["used_cpu_sys"] != "1.25" || info["absent"] != "" {
		t.Fatalf("ParseInfo = %v", info)
	}
	if cs := ParseInfo("txt:cluster_state:ok\r\ncluster_slots_ok:16384\r\n"); cs["cluster_state"] != "ok" || len(cs) != 2 {
		t.Fatalf("ParseInfo of a CLUSTER INFO verbatim string = %v", cs)
	}
	if _, ok := info["# Replication"]; ok {
		t.Fatalf("a section header was read as a field: %v", info)
	}
	if _, err := info.CPUSeconds(); err == nil {
		t.Errorf("CPUSeconds without used_cpu_user: no error")
	}
	if cpu, err := ParseInfo("used_cpu_sys:1.25\r\nused_cpu_user:2.5\r\n").CPUSeconds(); err != nil || cpu != 3.75 {
		t.Errorf("CPUSeconds = %v, %v; want 3.75", cpu, err)
	}
	stats := info.CommandStats()
	if len(stats) != 2 || stats["evalsha"] != (CommandStat{Calls: 10, Usec: 150}) || stats["client|list"] != (CommandStat{Calls: 2, Usec: 9.5}) {
		t.Fatalf("CommandStats = %+v", stats)
	}
}

func TestAddrIsUsedAsIs(t *testing.T) {
	own := New(t, OwnServer())
	t.Setenv(EnvAddr, "")
	s, err := Start(context.Background(), Addr(own.Addr))
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr != own.Addr || s.Source != "addr" {
		t.Fatalf("Start with Addr: addr %s source %s, want %s addr", s.Addr, s.Source, own.Addr)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ping(context.Background(), own.Addr); err != nil {
		t.Fatalf("closing a given server must not stop it: %v", err)
	}
	if _, err := Start(context.Background(), Addr(freeAddr(t))); err == nil {
		t.Fatal("Start with an Addr that does not answer: no error")
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + ports[0]
}

func TestWaitFor(t *testing.T) {
	ctx := context.Background()
	tries := 0
	if err := WaitFor(ctx, time.Minute, "three tries", func() (bool, error) { tries++; return tries == 3, nil }); err != nil || tries != 3 {
		t.Fatalf("WaitFor: %v after %d tries, want nil after 3", err, tries)
	}
	boom := errors.New("boom")
	if err := WaitFor(ctx, time.Minute, "an error", func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Fatalf("WaitFor with a failing condition: %v, want it wrapped", err)
	}
	if err := WaitFor(ctx, 0, "never", func() (bool, error) { return false, nil }); err == nil || !strings.Contains(err.Error(), "never") {
		t.Fatalf("WaitFor past its limit: %v, want an error naming what was awaited", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := WaitFor(cancelled, time.Minute, "never", func() (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitFor with a cancelled context: %v", err)
	}
}

// A server with an append-only file comes back from kill -9 with its data; one without comes
// back empty.
func TestCrashAndRestartOnTheSameFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"appendonly", []Option{AppendOnly("always")}, "kept"},
		{"no persistence", []Option{OwnServer()}, ""},
	} {
		s := New(t, tc.opts...)
		c := s.Client(t)
		if err := c.Do(ctx, c.B().Set().Key("k").Value("kept").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := s.Crash(); err != nil {
			t.Fatal(err)
		}
		if err := ping(ctx, s.Addr); err == nil {
			t.Fatalf("%s: server answers after Crash", tc.name)
		}
		if err := s.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := c.Do(ctx, c.B().Get().Key("k").Build()).ToString()
		if tc.want == "" && !valkey.IsValkeyNil(err) || tc.want != "" && (err != nil || got != tc.want) {
			t.Fatalf("%s: GET after kill -9 and restart: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if err := (&Server{Addr: "127.0.0.1:1"}).Crash(); err == nil {
		t.Fatal("Crash of a server Start did not launch should fail")
	}
}
