package dialguard

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:2379": true, "127.12.0.3:2379": true, "127.0.0.1": true,
		"10.244.1.10:2379": false, "192.168.0.1:80": false, "[::1]:2379": false, "128.0.0.1:1": false, "localhost:2379": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestDialerRefusesAndReportsOffMachineAddresses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var reported []string
	dial := Dialer(func(addr string) { reported = append(reported, addr) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	conn, err := dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatalf("a loopback listener: %v", err)
	}
	conn.Close()
	// 192.0.2.0/24 is reserved for documentation: nothing answers there, and the guard
	// refuses before the connect is attempted.
	if _, err := dial(ctx, "192.0.2.10:2379"); err == nil {
		t.Fatal("an address off the machine was dialled")
	}
	if len(reported) != 1 || reported[0] != "192.0.2.10:2379" {
		t.Errorf("reported %q, want the one off-machine address", reported)
	}
}
