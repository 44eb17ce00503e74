package backup

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"etcdops.dev/etcdops/test/s3server"
)

// A snapshot larger than the client's part size (16 MiB) is uploaded in parts: the real
// server assembles them, the copy to its final name keeps every byte, and the metadata
// stored beside it comes back.
func TestLargeSnapshotUploadsInParts(t *testing.T) {
	srv := s3server.Start(t, testBucket)
	target, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	// A proxy in front of the server counts the multipart requests.
	var parts atomic.Int32
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Query().Has("partNumber") {
			parts.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	s, err := NewS3(S3Config{Endpoint: front.URL, Bucket: testBucket, Prefix: "ns/etcd", Region: s3server.Region, AccessKeyID: s3server.AccessKey, SecretAccessKey: s3server.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 40<<20)
	rand.Read(data)
	sum := sha256.Sum256(data)
	path := filepath.Join(t.TempDir(), "big.db")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := SnapshotName("etcd", time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC), 42)
	meta := Meta{SHA256: hex.EncodeToString(sum[:]), Revision: 42, Member: "abc"}
	if err := s.Put(ctx, name, f, int64(len(data)), meta); err != nil {
		t.Fatal(err)
	}
	if n := parts.Load(); n < 3 {
		t.Fatalf("%d parts uploaded for 40 MiB, want at least 3", n)
	}
	var got bytes.Buffer
	gotMeta, err := s.Fetch(ctx, name, &got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) || gotMeta != meta {
		t.Fatalf("fetched %d bytes (equal: %t), meta %+v; stored %d bytes, %+v", got.Len(), bytes.Equal(got.Bytes(), data), gotMeta, len(data), meta)
	}
	objs, err := s.List(ctx)
	if err != nil || len(objs) != 1 || objs[0].Size != int64(len(data)) {
		t.Fatalf("listed %+v, %v; want the one snapshot of %d bytes and no temporary object", objs, err, len(data))
	}
}

// A listing past the server's page of 1000 keys finds every snapshot, and nothing else under
// the prefix: not another cluster's, not a temporary upload, not a name of another shape.
func TestS3ListingPagesAndKeepsToSnapshots(t *testing.T) {
	srv := s3server.Start(t, testBucket)
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	put := func(key string) {
		t.Helper()
		if _, err := cli.PutObject(ctx, testBucket, key, strings.NewReader("x"), 1, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Names sorting before the snapshots', so that these come on a later page.
	for i := range 1010 {
		put(fmt.Sprintf("ns/etcd/a-%04d", i))
	}
	put("ns/etcd/.tmp/" + SnapshotName("etcd", time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), 1) + ".0a0b")
	put("ns/etcd-other/" + SnapshotName("etcd", time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), 2))
	var want []string
	for i := range 3 {
		name := SnapshotName("etcd", time.Date(2026, 12, 1, 9, i, 0, 0, time.UTC), int64(10+i))
		put("ns/etcd/" + name)
		want = append(want, name)
	}
	s, err := NewS3(S3Config{Endpoint: srv.Endpoint, Bucket: testBucket, Prefix: "ns/etcd", Region: s3server.Region, AccessKeyID: s3server.AccessKey, SecretAccessKey: s3server.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.Name)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
}
