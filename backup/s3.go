package backup

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config is an S3-compatible bucket and the credentials to reach it.
type S3Config struct {
	Endpoint string // URL with scheme: https://s3.eu-west-1.amazonaws.com
	Bucket   string
	Prefix   string // object names start with it; a "/" is added when missing
	Region   string
	// AccessKeyID, SecretAccessKey and SessionToken sign the requests (signature V4).
	AccessKeyID, SecretAccessKey, SessionToken string
	// CA, PEM, verifies the endpoint's certificate instead of the system's roots.
	CA []byte
}

// s3Store keeps snapshots as objects. A snapshot is uploaded under a temporary name in the
// destination's .tmp/ and copied to its name server-side once complete, so that a listing
// never shows part of one.
type s3Store struct {
	cli    *minio.Client
	bucket string
	// root is the destination's prefix, prefix this store's: root, or a directory below it.
	root, prefix string
}

// copyLimit is the largest object S3 copies in one request; beyond it the copy is multipart.
const copyLimit = 5 << 30

// Metadata keys kept on each snapshot object (x-amz-meta-*).
const (
	metaSHA256   = "Etcdops-Sha256"
	metaRevision = "Etcdops-Revision"
	metaMember   = "Etcdops-Member"
)

// NewS3 returns the store of c. It dials nothing until used.
func NewS3(c S3Config) (Store, error) {
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("s3 endpoint %q is not an http(s) URL", c.Endpoint)
	}
	if c.Bucket == "" || c.AccessKeyID == "" || c.SecretAccessKey == "" {
		return nil, errors.New("s3: bucket and credentials are required")
	}
	transport, err := minio.DefaultTransport(u.Scheme == "https")
	if err != nil {
		return nil, err
	}
	if len(c.CA) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.CA) {
			return nil, errors.New("s3: no CA certificate in the CA file")
		}
		transport.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	cli, err := minio.New(u.Host, &minio.Options{
		Creds:     credentials.NewStaticV4(c.AccessKeyID, c.SecretAccessKey, c.SessionToken),
		Secure:    u.Scheme == "https",
		Region:    c.Region,
		Transport: http.RoundTripper(transport),
	})
	if err != nil {
		return nil, err
	}
	prefix := c.Prefix
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &s3Store{cli: cli, bucket: c.Bucket, root: prefix, prefix: prefix}, nil
}

func (s *s3Store) Sub(dir string) Store {
	return &s3Store{cli: s.cli, bucket: s.bucket, root: s.root, prefix: s.prefix + dir}
}

func (s *s3Store) Dirs(ctx context.Context, dir string) ([]string, error) {
	var out []string
	for info := range s.cli.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + dir}) {
		if info.Err != nil {
			return nil, fmt.Errorf("list %s: %w", s.Where(dir), info.Err)
		}
		// Without Recursive, what lies deeper comes as one common prefix per directory.
		if name, ok := strings.CutPrefix(info.Key, s.prefix+dir); ok && strings.HasSuffix(name, "/") && strings.Count(name, "/") == 1 {
			out = append(out, strings.TrimSuffix(name, "/"))
		}
	}
	return out, nil
}

func (s *s3Store) Where(name string) string {
	return "s3://" + s.bucket + "/" + s.prefix + name
}

func (s *s3Store) Put(ctx context.Context, name string, r io.ReadSeeker, size int64, meta Meta) error {
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return err
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return err
	}
	final := s.prefix + name
	tmp := s.root + ".tmp/" + strings.TrimPrefix(final, s.root) + "." + hex.EncodeToString(nonce[:])
	var user map[string]string
	if meta != (Meta{}) {
		user = map[string]string{metaSHA256: meta.SHA256, metaRevision: strconv.FormatInt(meta.Revision, 10), metaMember: meta.Member}
	}
	if _, err := s.cli.PutObject(ctx, s.bucket, tmp, r, size, minio.PutObjectOptions{ContentType: "application/octet-stream", UserMetadata: user}); err != nil {
		return fmt.Errorf("upload s3://%s/%s: %w", s.bucket, tmp, err)
	}
	// The temporary object goes whatever happens next; a failed removal leaves only it.
	defer s.cli.RemoveObject(context.WithoutCancel(ctx), s.bucket, tmp, minio.RemoveObjectOptions{})
	dst := minio.CopyDestOptions{Bucket: s.bucket, Object: final, ReplaceMetadata: true, UserMetadata: user}
	src := minio.CopySrcOptions{Bucket: s.bucket, Object: tmp}
	var err error
	if size <= copyLimit {
		_, err = s.cli.CopyObject(ctx, dst, src)
	} else {
		_, err = s.cli.ComposeObject(ctx, dst, src)
	}
	if err != nil {
		return fmt.Errorf("copy to %s: %w", s.Where(name), err)
	}
	st, err := s.cli.StatObject(ctx, s.bucket, final, minio.StatObjectOptions{})
	if err != nil {
		return fmt.Errorf("check %s: %w", s.Where(name), err)
	}
	if st.Size != size {
		return fmt.Errorf("check %s: stored %d bytes, uploaded %d", s.Where(name), st.Size, size)
	}
	return nil
}

func (s *s3Store) List(ctx context.Context) ([]Object, error) {
	var out []Object
	for info := range s.cli.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix}) {
		if info.Err != nil {
			return nil, fmt.Errorf("list %s: %w", s.Where(""), info.Err)
		}
		name, ok := strings.CutPrefix(info.Key, s.prefix)
		if !ok || strings.Contains(name, "/") {
			continue
		}
		if o, ok := parseName(name); ok {
			o.Size = info.Size
			out = append(out, o)
		}
	}
	return out, nil
}

func (s *s3Store) ListDeltas(ctx context.Context) ([]Delta, error) {
	var out []Delta
	opts := minio.ListObjectsOptions{Prefix: s.prefix + deltaDir, Recursive: true}
	for info := range s.cli.ListObjects(ctx, s.bucket, opts) {
		if info.Err != nil {
			return nil, fmt.Errorf("list %s: %w", s.Where(deltaDir), info.Err)
		}
		if d, ok := parseDeltaName(strings.TrimPrefix(info.Key, s.prefix)); ok {
			d.Size = info.Size
			out = append(out, d)
		}
	}
	return out, nil
}

func (s *s3Store) Fetch(ctx context.Context, name string, w io.Writer) (Meta, error) {
	obj, err := s.cli.GetObject(ctx, s.bucket, s.prefix+name, minio.GetObjectOptions{})
	if err != nil {
		return Meta{}, fmt.Errorf("download %s: %w", s.Where(name), err)
	}
	defer obj.Close()
	st, err := obj.Stat()
	if err != nil {
		if minio.ToErrorResponse(err).Code == "NoSuchKey" {
			return Meta{}, fmt.Errorf("%w: %s", ErrNotFound, s.Where(name))
		}
		return Meta{}, fmt.Errorf("download %s: %w", s.Where(name), err)
	}
	if _, err := io.Copy(w, obj); err != nil {
		return Meta{}, fmt.Errorf("download %s: %w", s.Where(name), err)
	}
	meta := Meta{SHA256: userMeta(st.UserMetadata, metaSHA256), Member: userMeta(st.UserMetadata, metaMember)}
	meta.Revision, _ = strconv.ParseInt(userMeta(st.UserMetadata, metaRevision), 10, 64)
	return meta, nil
}

// userMeta reads a metadata key whatever case the server returned it in.
func userMeta(m map[string]string, key string) string {
	for k, v := range m {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (s *s3Store) Delete(ctx context.Context, name string) error {
	if err := s.cli.RemoveObject(ctx, s.bucket, s.prefix+name, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("delete %s: %w", s.Where(name), err)
	}
	return nil
}
