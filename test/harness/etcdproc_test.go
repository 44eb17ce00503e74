package harness

import (
	"slices"
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
