package backup

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Credential file names in the mounted credentials Secret.
const (
	KeyAccessKeyID     = "AWS_ACCESS_KEY_ID"
	KeySecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	KeySessionToken    = "AWS_SESSION_TOKEN"
)

// DestinationFlags are the command-line flags that name a Store: an S3-compatible bucket or a
// directory.
type DestinationFlags struct {
	S3Endpoint, Bucket, Prefix, Region string
	// CredentialsDir holds the credential files (KeyAccessKeyID, ...), as a mounted Secret.
	CredentialsDir string
	CAFile         string
	Dir            string
}

// Register adds the flags to fs, each name after prefix ("" or "restore-").
func (d *DestinationFlags) Register(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&d.S3Endpoint, prefix+"s3-endpoint", "", "S3-compatible storage URL, e.g. https://s3.eu-west-1.amazonaws.com")
	fs.StringVar(&d.Bucket, prefix+"bucket", "", "bucket")
	fs.StringVar(&d.Prefix, prefix+"prefix", "", "object name prefix")
	fs.StringVar(&d.Region, prefix+"region", "", "bucket region")
	fs.StringVar(&d.CredentialsDir, prefix+"credentials-dir", "", "directory with the files "+KeyAccessKeyID+" and "+KeySecretAccessKey)
	fs.StringVar(&d.CAFile, prefix+"ca-file", "", "CA bundle (PEM) to verify the storage's certificate with")
	fs.StringVar(&d.Dir, prefix+"dir", "", "directory to keep snapshots in, instead of S3")
}

// Set reports whether any destination flag was given.
func (d *DestinationFlags) Set() bool {
	return d.S3Endpoint != "" || d.Dir != ""
}

// Open returns the Store the flags name, reading the credential files.
func (d *DestinationFlags) Open() (Store, error) {
	switch {
	case d.S3Endpoint != "" && d.Dir != "":
		return nil, errors.New("set one destination: an S3 endpoint or a directory, not both")
	case d.Dir != "":
		return NewDir(d.Dir)
	case d.S3Endpoint == "":
		return nil, errors.New("no destination: set an S3 endpoint (with bucket and credentials) or a directory")
	}
	c := S3Config{Endpoint: d.S3Endpoint, Bucket: d.Bucket, Prefix: d.Prefix, Region: d.Region}
	if d.CredentialsDir == "" {
		return nil, errors.New("s3: a credentials directory is required")
	}
	for _, f := range []struct {
		key      string
		into     *string
		optional bool
	}{{KeyAccessKeyID, &c.AccessKeyID, false}, {KeySecretAccessKey, &c.SecretAccessKey, false}, {KeySessionToken, &c.SessionToken, true}} {
		b, err := os.ReadFile(filepath.Join(d.CredentialsDir, f.key))
		if err != nil {
			if f.optional && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("s3 credentials: %w", err)
		}
		*f.into = strings.TrimSpace(string(b))
	}
	if d.CAFile != "" {
		b, err := os.ReadFile(d.CAFile)
		if err != nil {
			return nil, fmt.Errorf("s3 CA: %w", err)
		}
		c.CA = b
	}
	return NewS3(c)
}
