package harness

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A real etcd process gets the launcher's argv as it is, but for the listen URLs, which bind
// the pod's own address: on 0.0.0.0 every pod would take the same ports on every interface.
func TestPodArgvBindsOnlyThePodAddress(t *testing.T) {
	args := []string{
		"--name=etcd-0",
		"--listen-peer-urls=https://0.0.0.0:2380",
		"--listen-client-urls=http://0.0.0.0:2379,https://0.0.0.0:2379",
		"--advertise-client-urls=http://etcd-0.etcd.ns.svc.cluster.local:2379",
		"--listen-metrics-urls", "http://127.0.0.1:2381",
		"--data-dir=/v/data",
		"--snapshot-count=5000",
	}
	got, vals := podArgv(args, "127.3.4.5")
	want := []string{
		"--name=etcd-0",
		"--listen-peer-urls=https://127.3.4.5:2380",
		"--listen-client-urls=http://127.3.4.5:2379,https://127.3.4.5:2379",
		"--advertise-client-urls=http://etcd-0.etcd.ns.svc.cluster.local:2379",
		"--listen-metrics-urls", "http://127.3.4.5:2381",
		"--data-dir=/v/data",
		"--snapshot-count=5000",
	}
	if !slices.Equal(got, want) {
		t.Errorf("podArgv:\n got %q\nwant %q", got, want)
	}
	if vals["data-dir"] != "/v/data" || vals["listen-metrics-urls"] != "http://127.3.4.5:2381" {
		t.Errorf("flag values %v", vals)
	}
}

func TestImageVersion(t *testing.T) {
	for image, want := range map[string]string{
		"gcr.io/etcd-development/etcd:v3.6.16": "v3.6.16",
		"localhost:5000/etcd:v3.5.35":          "v3.5.35",
		"localhost:5000/etcd":                  "",
	} {
		if got := ImageVersion(image); got != want {
			t.Errorf("ImageVersion(%q) = %q, want %q", image, got, want)
		}
	}
}

func TestLogMessages(t *testing.T) {
	log := `{"level":"info","msg":"starting"}
{"level":"fatal","ts":1,"caller":"etcdmain/etcd.go:204","msg":"discovery failed","error":"member has already been bootstrapped"}
`
	if got := lastFatal(log); got != "discovery failed, error: member has already been bootstrapped" {
		t.Errorf("lastFatal = %q", got)
	}
	refused := "flag provided but not defined: -feature-gates\nUsage:\n\n  etcd [flags]\n    Start an etcd server.\n"
	if got := lastFatal(refused); got != "flag provided but not defined: -feature-gates" {
		t.Errorf("lastFatal = %q", got)
	}
}

// A removed member's panic on a request in the second before it stops is not etcd's panic;
// the same panic in a member that was not removed is.
func TestLogPanicLeavesOutARemovedMember(t *testing.T) {
	removed := `{"level":"info","msg":"removed member","cluster-id":"c","local-member-id":"a1","removed-remote-peer-id":"a1"}
{"level":"panic","msg":"failed to find local ID in cluster members","cluster-id":"c","local-member-id":"a1"}
panic: failed to find local ID in cluster members
`
	other := strings.Replace(removed, `"removed-remote-peer-id":"a1"`, `"removed-remote-peer-id":"b2"`, 1)
	dir := t.TempDir()
	for name, want := range map[string]bool{removed: false, other: true} {
		f := filepath.Join(dir, "etcd.log")
		if err := os.WriteFile(f, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if msg, got := logPanic(f); got != want {
			t.Errorf("logPanic = %q, %v; want %v for\n%s", msg, got, want, name)
		}
	}
}
