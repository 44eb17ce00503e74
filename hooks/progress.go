package hooks

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"etcdops.dev/etcdops/backupresult"
	"etcdops.dev/etcdops/sync"
)

// streamProgress reads the continuous backup's progress from url (Needs.ProgressURL) through
// the ProgressReader under ProgressTimeout; with no url there is nothing to read.
func (h *handler) streamProgress(ctx context.Context, url string) sync.StreamProgress {
	if url == "" {
		return sync.StreamProgress{Err: "the stream's Deployment is not observed yet"}
	}
	ctx, cancel := context.WithTimeout(ctx, h.ProgressTimeout)
	defer cancel()
	return h.Progress.ReadProgress(ctx, url)
}

// HTTPProgress reads the progress with one GET of the stream's /progress: in-cluster, never
// through a proxy, one idle connection per stream kept between syncs and closed when syncs
// stop.
type HTTPProgress struct{ client *http.Client }

// NewHTTPProgress returns a reader with a client of its own.
func NewHTTPProgress() *HTTPProgress {
	return &HTTPProgress{client: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 2 * time.Minute}}}
}

// ReadProgress reads the progress from url under the context's deadline.
func (p *HTTPProgress) ReadProgress(ctx context.Context, url string) sync.StreamProgress {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return sync.StreamProgress{Err: err.Error()}
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return sync.StreamProgress{Err: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sync.StreamProgress{Err: fmt.Sprintf("GET %s: %s", url, resp.Status)}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return sync.StreamProgress{Err: err.Error()}
	}
	pr, err := backupresult.DecodeProgress(b)
	if err != nil {
		return sync.StreamProgress{Err: err.Error()}
	}
	return sync.StreamProgress{Known: true, Progress: pr}
}
