package valkeytest

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
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
