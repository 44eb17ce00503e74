package backup

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BenchmarkTake backs up a one-member cluster holding about 16 MiB into a directory: read,
// verified, stored. bytes/s is the snapshot's size over the time of one backup; with a
// bandwidth bound it stays at the bound.
func BenchmarkTake(b *testing.B) {
	ms := startCluster(b, 1)
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints(ms...), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	value := strings.Repeat("v", 16<<10)
	for i := range 1024 {
		if _, err := cli.Put(context.Background(), fmt.Sprintf("k-%04d", i), value); err != nil {
			b.Fatal(err)
		}
	}
	for _, bound := range []int64{0, 8 << 20} {
		b.Run(fmt.Sprintf("bound=%dMiB/s", bound>>20), func(b *testing.B) {
			s, err := NewDir(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			o := TakeOptions{Endpoints: endpoints(ms...), Cluster: "etcd", Store: s, WorkDir: b.TempDir(), BytesPerSecond: bound,
				Retention: Retention{Keep: 1}, Now: func() time.Time { now = now.Add(time.Minute); return now }}
			var size int64
			for b.Loop() {
				r, err := Take(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				size = r.Size
			}
			b.SetBytes(size)
		})
	}
}
