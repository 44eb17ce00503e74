package membertool

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	gosync "sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"etcdops.dev/etcdops/backup"
	"etcdops.dev/etcdops/backupresult"
)

// streamMetrics are the continuous backup's recovery point, as series labelled with the
// cluster's name: the newest change stored (revision and when), the newest change the watch
// delivered, the failures, and whether another writer superseded this one. Behind means
// watched above stored while the last store is old (the EtcdBackupStreamBehind alert). The
// same, with how long the stream has not been caught up, is served as JSON
// (backupresult.Progress) for the operator's status.
type streamMetrics struct {
	registry                              *prometheus.Registry
	stored, storedAt, watched, superseded prometheus.Gauge
	failures                              prometheus.Counter

	now      func() time.Time
	mu       gosync.Mutex
	progress backupresult.Progress
}

func newStreamMetrics(cluster string, now func() time.Time) *streamMetrics {
	labels := prometheus.Labels{"name": cluster}
	start := now()
	m := &streamMetrics{
		now:      now,
		progress: backupresult.Progress{CaughtUpTime: start},
		registry: prometheus.NewRegistry(),
		stored: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcdops_backup_stream_stored_revision", ConstLabels: labels,
			Help: "Every change up to this revision is stored: the newest chunk's last, or the snapshot the chain resumes after."}),
		storedAt: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcdops_backup_stream_stored_timestamp_seconds", ConstLabels: labels,
			Help: "When this stream last stored a chunk, or started, in Unix seconds."}),
		watched: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcdops_backup_stream_watched_revision", ConstLabels: labels,
			Help: "Newest revision the watch delivered to this stream."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcdops_backup_stream_failures_total", ConstLabels: labels,
			Help: "Failures the stream resumed from: a lost watch or leader, a store that failed, a compacted or broken chain."}),
		superseded: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcdops_backup_stream_superseded", ConstLabels: labels,
			Help: "1 once another writer claimed this stream's lineage: it stores nothing more."}),
	}
	m.registry.MustRegister(m.stored, m.storedAt, m.watched, m.failures, m.superseded)
	// Until its first chunk, a stream counts from its start, not from 1970.
	m.storedAt.Set(float64(start.Unix()))
	return m
}

func (m *streamMetrics) chunkStored(d backup.Delta) {
	at := m.now()
	m.stored.Set(float64(d.Last))
	m.storedAt.Set(float64(at.Unix()))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress.StoredRevision, m.progress.StoredTime = d.Last, at
}

// resumed: every change up to stored is in the destination, stored before or by this stream.
func (m *streamMetrics) resumed(stored int64) {
	m.stored.Set(float64(stored))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress.StoredRevision = stored
}

func (m *streamMetrics) watchedUpTo(rev int64) {
	m.watched.Set(float64(rev))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress.Revision = max(m.progress.Revision, rev)
}

func (m *streamMetrics) caughtUp(rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress.CaughtUpTime = m.now()
	m.progress.Revision = max(m.progress.Revision, rev)
}

func (m *streamMetrics) failed(err error) {
	m.failures.Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress.LastError, m.progress.LastErrorTime = err.Error(), m.now()
}

func (m *streamMetrics) claimed(lineage string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress.Lineage = lineage
}

func (m *streamMetrics) supersededBy(by string) {
	m.superseded.Set(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.progress.SupersededBy, m.progress.SupersededTime = by, m.now()
}

// current is the progress as of now.
func (m *streamMetrics) current() backupresult.Progress {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.progress
	p.BehindSeconds = max(0, m.now().Sub(p.CaughtUpTime).Seconds())
	return p
}

// serve serves the metrics on addr until ctx ends.
func (m *streamMetrics) serve(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc(backupresult.ProgressPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(m.current())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			srv.Close()
		}
	}()
	return nil
}
