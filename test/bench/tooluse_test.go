package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/internal/etcdbin"
	"etcdops.dev/etcdops/internal/etcdtest"
	"etcdops.dev/etcdops/internal/s3server"
)

var toolUsage = flag.Bool("tool-usage", false, "measure the memory and CPU of each etcdops-member command on real etcd servers and S3 (TestToolUsage)")

// usage is what one run of the member tool took: the peak of its anonymous memory (what a
// memory limit must hold: the file pages it maps or writes are page cache, which the kernel
// reclaims under the limit), its peak resident set as the kernel counts it, and its CPU time.
type usage struct {
	command     string
	role        v1alpha1.ToolRole
	spec        v1alpha1.EtcdClusterSpec // the spec whose default resources the run is held to
	anonKiB     int64
	maxRSSKiB   int64
	cpu, wall   time.Duration
	description string
}

// TestToolUsage measures every etcdops-member command the operator runs in its own pods, on a
// real 3-member etcd cluster (the default version's server, internal/etcdbin) holding
// -tool-usage-db bytes, and real S3 (versitygw), prints a table and checks that the default
// resources of each command's pod (v1alpha1.ToolResources) hold what it used. The defaults
// were chosen from it (docs/operate.md, "Resources and pull secrets").
//
//	go test ./test/bench -run TestToolUsage -tool-usage -v -timeout 20m
func TestToolUsage(t *testing.T) {
	if !*toolUsage {
		t.Skip("measures the member tool on real etcd servers and S3; run with -tool-usage")
	}
	etcdBin, err := etcdbin.Path(v1alpha1.DefaultVersion)
	if err != nil {
		t.Skipf("etcd %s: %v", v1alpha1.DefaultVersion, err)
	}
	s3 := s3server.Start(t, "backups")
	dir := t.TempDir()
	tool := filepath.Join(dir, "etcdops-member")
	build := exec.Command("go", "build", "-trimpath", "-o", tool, "etcdops.dev/etcdops/cmd/etcdops-member")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	members := startEtcd(t, etcdBin, dir, 3)
	var eps []string
	for _, m := range members {
		eps = append(eps, m.client)
	}
	endpoints := "--endpoints=" + strings.Join(eps, ",")
	fill(t, eps, *toolUsageDB)

	creds := filepath.Join(dir, "credentials")
	must(t, os.MkdirAll(creds, 0o700))
	must(t, os.WriteFile(filepath.Join(creds, "AWS_ACCESS_KEY_ID"), []byte(s3server.AccessKey), 0o600))
	must(t, os.WriteFile(filepath.Join(creds, "AWS_SECRET_ACCESS_KEY"), []byte(s3server.SecretKey), 0o600))
	work := filepath.Join(dir, "work")
	must(t, os.MkdirAll(work, 0o700))
	s3Flags := []string{"--s3-endpoint=" + s3.Endpoint, "--bucket=backups", "--prefix=db/etcd/", "--region=" + s3server.Region, "--credentials-dir=" + creds}

	id := func(i int) string { return fmt.Sprintf("--id=%x", members[i].id(t)) }
	learner := memberURL(t)
	var results []usage
	run := func(what string, args ...string) usage {
		u := measure(t, tool, args)
		u.description = what
		if u.command == "backup" {
			u.role = v1alpha1.ToolBackup
		}
		results = append(results, u)
		return u
	}
	run("install: copies the tool into the etcd pod", "install", "--to="+filepath.Join(dir, "opt", "etcdops-member"))
	run("add-learner", "add-learner", endpoints, "--member=etcd-3", "--peer-url="+learner)
	run("remove (the learner)", "remove", endpoints, "--member=etcd-3", "--id="+learnerID(t, eps, learner))
	run("move-leader", "move-leader", endpoints, "--member=etcd-2", id(2))
	run("compact", "compact", endpoints, "--member=etcd-0", "--timeout=4m")
	run("defragment", "defragment", "--endpoints="+eps[0], "--member=etcd-0", id(0), "--timeout=4m")
	run("disarm (no alarm: already done)", "disarm", endpoints, "--member=etcd-0", "--alarm=NOSPACE", id(0))
	run("backup to a directory", "backup", endpoints, "--member=etcd-2", "--cluster=etcd", "--dir="+filepath.Join(dir, "claim"), "--work-dir="+work,
		"--termination-log="+filepath.Join(dir, "termination-log"), "--max-bandwidth=1073741824", "--keep=2")
	run("backup to S3", append([]string{"backup", endpoints, "--member=etcd-2", "--cluster=etcd", "--work-dir=" + work,
		"--termination-log=" + filepath.Join(dir, "termination-log"), "--max-bandwidth=1073741824", "--keep=2"}, s3Flags...)...)
	for _, chunk := range []int64{4 << 20, 64 << 20} {
		u := streamUnderLoad(t, tool, eps, append([]string{"stream-backup", endpoints, "--cluster=etcd", "--work-dir=" + work,
			"--interval=30s", fmt.Sprintf("--max-chunk-bytes=%d", chunk), "--metrics-addr=127.0.0.1:" + strconv.Itoa(etcdtest.FreePort(t))}, s3Flags...))
		u.description = fmt.Sprintf("stream-backup, %d MiB chunks, 30 s interval, 60 s of 64 KiB writes", chunk>>20)
		u.role = v1alpha1.ToolStream
		u.spec.Backup = &v1alpha1.BackupSpec{Continuous: &v1alpha1.ContinuousBackup{MaxChunkSize: resource.NewQuantity(chunk, resource.BinarySI)}}
		results = append(results, u)
	}

	// The defaults must hold what was measured with room to spare: a quarter of the memory
	// limit above the peak of anonymous memory. A member Job's resident set, its binary's
	// pages included, fits under the limit as a whole.
	for _, u := range results {
		r := v1alpha1.ToolResources(u.spec, u.role)
		limit := r.Limits[corev1.ResourceMemory]
		if u.anonKiB<<10 > limit.Value()*3/4 || u.role == v1alpha1.ToolMemberJob && u.maxRSSKiB<<10 > limit.Value() {
			t.Errorf("%s: %d KiB of anonymous memory, %d KiB resident, over what the default memory limit %s allows", u.description, u.anonKiB, u.maxRSSKiB, limit.String())
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "etcd %s, 3 members, database %d MiB; etcdops-member built by this commit\n\n", v1alpha1.DefaultVersion, *toolUsageDB>>20)
	fmt.Fprintf(&b, "| command | peak anonymous memory | peak RSS | CPU | wall |\n|---|---|---|---|---|\n")
	for _, u := range results {
		fmt.Fprintf(&b, "| %s | %.1f MiB | %.1f MiB | %.2f s | %.1f s |\n", u.description, float64(u.anonKiB)/1024, float64(u.maxRSSKiB)/1024, u.cpu.Seconds(), u.wall.Seconds())
	}
	t.Log("\n" + b.String())
}

var toolUsageDB = flag.Int64("tool-usage-db", 256<<20, "bytes of keys written before TestToolUsage measures")

// etcdMember is one real etcd server of the measured cluster.
type etcdMember struct {
	name, client, peer string
}

func (m etcdMember) id(t *testing.T) uint64 {
	cli := client(t, []string{m.client})
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, m.client)
	must(t, err)
	return st.Header.MemberId
}

// startEtcd starts n members of a new cluster as processes on loopback ports, stopped with
// the test.
func startEtcd(t *testing.T, bin, dir string, n int) []etcdMember {
	var ms []etcdMember
	var initial []string
	for i := range n {
		m := etcdMember{name: fmt.Sprintf("etcd-%d", i), client: memberURL(t), peer: memberURL(t)}
		ms = append(ms, m)
		initial = append(initial, m.name+"="+m.peer)
	}
	for _, m := range ms {
		log, err := os.Create(filepath.Join(dir, m.name+".log"))
		must(t, err)
		cmd := exec.Command(bin, "--name="+m.name, "--data-dir="+filepath.Join(dir, m.name),
			"--listen-client-urls="+m.client, "--advertise-client-urls="+m.client,
			"--listen-peer-urls="+m.peer, "--initial-advertise-peer-urls="+m.peer,
			"--initial-cluster="+strings.Join(initial, ","), "--initial-cluster-state=new",
			"--initial-cluster-token=tool-usage", "--quota-backend-bytes=8589934592", "--log-level=warn")
		cmd.Stdout, cmd.Stderr = log, log
		must(t, cmd.Start())
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
			}
			log.Close()
		})
	}
	eps := make([]string, 0, n)
	for _, m := range ms {
		eps = append(eps, m.client)
	}
	cli := client(t, eps)
	defer cli.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cli.Put(ctx, "ready", "1")
		cancel()
		if err == nil {
			return ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not serve within a minute: %v (logs in %s)", err, dir)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func memberURL(t *testing.T) string {
	return fmt.Sprintf("http://127.0.0.1:%d", etcdtest.FreePort(t))
}

func client(t *testing.T, eps []string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
	must(t, err)
	return cli
}

// fill writes about size bytes of values, in 64 KiB values.
func fill(t *testing.T, eps []string, size int64) {
	cli := client(t, eps)
	defer cli.Close()
	value := strings.Repeat("v", 64<<10)
	for i := int64(0); i*int64(len(value)) < size; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cli.Put(ctx, fmt.Sprintf("/fill/%08d", i), value)
		cancel()
		must(t, err)
	}
}

func learnerID(t *testing.T, eps []string, peer string) string {
	cli := client(t, eps)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	must(t, err)
	for _, m := range resp.Members {
		for _, u := range m.PeerURLs {
			if u == peer {
				return strconv.FormatUint(m.ID, 16)
			}
		}
	}
	t.Fatalf("no member with peer URL %s", peer)
	return ""
}

// measure runs the tool to its end, sampling its anonymous memory every 5 ms, and fails the
// test when it does not exit 0.
func measure(t *testing.T, tool string, args []string) usage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, tool, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	must(t, cmd.Start())
	peak := sampleAnon(cmd.Process.Pid)
	err := cmd.Wait()
	u := finish(cmd, start, peak())
	u.command = args[0]
	if err != nil {
		t.Fatalf("etcdops-member %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return u
}

// streamUnderLoad runs the stream for a minute while keys are written, then stops it with
// SIGTERM as the kubelet does.
func streamUnderLoad(t *testing.T, tool string, eps []string, args []string) usage {
	cmd := exec.Command(tool, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	must(t, cmd.Start())
	peak := sampleAnon(cmd.Process.Pid)
	cli := client(t, eps)
	defer cli.Close()
	value := strings.Repeat("w", 64<<10)
	for i := 0; time.Since(start) < time.Minute; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cli.Put(ctx, fmt.Sprintf("/stream/%08d", i%2000), value)
		cancel()
		must(t, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	u := finish(cmd, start, peak())
	u.command = args[0]
	if err != nil {
		t.Fatalf("etcdops-member stream-backup: %v\n%s", err, out.String())
	}
	return u
}

func finish(cmd *exec.Cmd, start time.Time, anon int64) usage {
	u := usage{wall: time.Since(start), anonKiB: anon}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		u.maxRSSKiB = ru.Maxrss
		u.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return u
}

// sampleAnon samples RssAnon of pid until it exits; the returned function stops the sampling
// and returns the peak, in KiB.
func sampleAnon(pid int) func() int64 {
	stop := make(chan struct{})
	done := make(chan int64)
	go func() {
		var peak int64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, rssAnon(pid))
			select {
			case <-stop:
				done <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 { close(stop); return <-done }
}

func rssAnon(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "RssAnon:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
