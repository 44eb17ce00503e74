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

// progressClient reads the continuous backup's progress: in-cluster, never through a proxy,
// one idle connection per stream kept between syncs and closed when syncs stop.
var progressClient = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, IdleConnTimeout: 2 * time.Minute}}

// streamProgress reads the continuous backup's progress from url (sync.ProgressURL) under
// ProgressTimeout. It never fails: what it could not read is Known false with the reason,
// which the planner reports and acts on in no way.
func (h *handler) streamProgress(ctx context.Context, url string) sync.StreamProgress {
	if url == "" {
		return sync.StreamProgress{Err: "the stream's Deployment is not observed yet"}
	}
	ctx, cancel := context.WithTimeout(ctx, h.ProgressTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return sync.StreamProgress{Err: err.Error()}
	}
	resp, err := progressClient.Do(req)
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
	p, err := backupresult.DecodeProgress(b)
	if err != nil {
		return sync.StreamProgress{Err: err.Error()}
	}
	return sync.StreamProgress{Known: true, Progress: p}
}
