package membertool

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"etcdops.dev/etcdops/backup"
)

// streamMetrics are the continuous backup's recovery point, as series labelled with the
// cluster's name: the newest change stored (revision and when), the newest change the watch
// delivered, and the failures. Behind means watched above stored while the last store is
// old (the EtcdBackupStreamBehind alert).
type streamMetrics struct {
	registry                  *prometheus.Registry
	stored, storedAt, watched prometheus.Gauge
	failures                  prometheus.Counter
}

func newStreamMetrics(cluster string, start time.Time) *streamMetrics {
	labels := prometheus.Labels{"name": cluster}
	m := &streamMetrics{
		registry: prometheus.NewRegistry(),
		stored: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcdops_backup_stream_stored_revision", ConstLabels: labels,
			Help: "Last revision of the newest chunk of changes this stream stored."}),
		storedAt: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcdops_backup_stream_stored_timestamp_seconds", ConstLabels: labels,
			Help: "When this stream last stored a chunk, or started, in Unix seconds."}),
		watched: prometheus.NewGauge(prometheus.GaugeOpts{Name: "etcdops_backup_stream_watched_revision", ConstLabels: labels,
			Help: "Newest revision the watch delivered to this stream."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "etcdops_backup_stream_failures_total", ConstLabels: labels,
			Help: "Failures the stream resumed from: a lost watch or leader, a store that failed, a compacted or broken chain."}),
	}
	m.registry.MustRegister(m.stored, m.storedAt, m.watched, m.failures)
	// Until its first chunk, a stream counts from its start, not from 1970.
	m.storedAt.Set(float64(start.Unix()))
	return m
}

func (m *streamMetrics) chunkStored(d backup.Delta, at time.Time) {
	m.stored.Set(float64(d.Last))
	m.storedAt.Set(float64(at.Unix()))
}

// serve serves the metrics on addr until ctx ends.
func (m *streamMetrics) serve(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
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
