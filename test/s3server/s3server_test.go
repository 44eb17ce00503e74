package s3server

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
)

func TestServesObjectsFromItsDirectory(t *testing.T) {
	s := Start(t, "bkt")
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte("hello")
	if _, err := cli.PutObject(ctx, "bkt", "p/o", bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	obj, err := cli.GetObject(ctx, "bkt", "p/o", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj)
	obj.Close()
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read back %q, %v", got, err)
	}
	// The posix backend keeps the object as a file: the server is the real one, not a fake.
	if onDisk, err := os.ReadFile(filepath.Join(s.Dir, "bkt", "p", "o")); err != nil || !bytes.Equal(onDisk, body) {
		t.Fatalf("object on disk %q, %v", onDisk, err)
	}
}
