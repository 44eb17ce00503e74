package backup

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestTieredRetentionExpired(t *testing.T) {
	now := time.Date(2026, 12, 10, 12, 30, 0, 0, time.UTC)
	// Four snapshots an hour (at :00, :15, :30, :45) for three days, the newest at 12:30.
	var objs []Object
	for at := now.Add(-72 * time.Hour); !at.After(now); at = at.Add(15 * time.Minute) {
		objs = append(objs, Object{Name: at.Format("0102T1504"), Time: at})
	}
	for _, tt := range []struct {
		name string
		r    Retention
		want []string // kept, newest first
	}{
		{"hourly 3: the newest of each of the last three hours",
			Retention{Hourly: 3}, []string{"1210T1230", "1210T1145", "1210T1045"}},
		{"keep 2 and hourly 3: the two newest, and the newest of two hours before",
			Retention{Keep: 2, Hourly: 3}, []string{"1210T1230", "1210T1215", "1210T1145", "1210T1045"}},
		{"daily 3: the newest of each of the last three days",
			Retention{Daily: 3}, []string{"1210T1230", "1209T2345", "1208T2345"}},
		{"hourly 2 and daily 2 overlap in the newest",
			Retention{Hourly: 2, Daily: 2}, []string{"1210T1230", "1210T1145", "1209T2345"}},
		{"keepFor 40m bounds the recent tier only",
			Retention{KeepFor: 40 * time.Minute, Daily: 2}, []string{"1210T1230", "1210T1215", "1210T1200", "1209T2345"}},
		{"more days than stored keeps the newest of each",
			Retention{Daily: 30}, []string{"1210T1230", "1209T2345", "1208T2345", "1207T2345"}},
	} {
		expired := tt.r.Expired(objs, now)
		var kept []string
		for _, o := range slices.Backward(objs) {
			if !slices.ContainsFunc(expired, func(e Object) bool { return e.Name == o.Name }) {
				kept = append(kept, o.Name)
			}
		}
		if fmt.Sprint(kept) != fmt.Sprint(tt.want) {
			t.Errorf("%s: kept %v, want %v", tt.name, kept, tt.want)
		}
	}
}

// A gap in the backups does not cost the history before it: the tiers count the hours and days
// that hold a snapshot.
func TestTieredRetentionReachesOverAGap(t *testing.T) {
	day := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	objs := []Object{
		{Name: "d1", Time: day}, {Name: "d2", Time: day.AddDate(0, 0, 1)}, {Name: "d3", Time: day.AddDate(0, 0, 2)},
		// Nothing for ten days, then one.
		{Name: "d13", Time: day.AddDate(0, 0, 12)},
	}
	expired := Retention{Daily: 3}.Expired(objs, day.AddDate(0, 0, 12))
	if len(expired) != 1 || expired[0].Name != "d1" {
		t.Fatalf("expired %+v, want only d1: the three newest days that hold a snapshot are kept", expired)
	}
}

// TestTieredRetentionOverAMonth takes a real snapshot every hour for 31 days, with the clock
// the backup Job takes its times from injected, and a chunk of changes after each (the chain
// the continuous backup would store), and checks that exactly the tiers' snapshots and their
// chains are left. The backup package is the honest place for a month: a snapshot's time is
// the member tool's clock (TakeOptions.Now, time.Now in a Job), which the end-to-end harness
// does not move (AdvanceHookClock moves only the hook's), and a month of Jobs would be a month.
func TestTieredRetentionOverAMonth(t *testing.T) {
	days := 31
	if testing.Short() {
		days = 9
	}
	ms := startCluster(t, 1)
	s, err := NewDir(filepath.Join(t.TempDir(), "claim"))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints(ms...), Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	start := time.Date(2026, 12, 1, 0, 20, 0, 0, time.UTC)
	var now time.Time
	o := takeOptions(t, s, endpoints(ms...), func() time.Time { return now })
	o.Retention = Retention{Keep: 6, Hourly: 24, Daily: 7}
	ctx := context.Background()
	var ls Store
	for i := range days * 24 {
		now = start.Add(time.Duration(i) * time.Hour)
		if _, err := cli.Put(ctx, "hour", now.Format(time.RFC3339)); err != nil {
			t.Fatal(err)
		}
		r, err := Take(ctx, o)
		if err != nil {
			t.Fatalf("backup at %s: %v", now, err)
		}
		if ls == nil {
			ls = LineageStore(s, r.Lineage)
		}
		if err := ls.Put(ctx, DeltaName(r.Revision, r.Revision+1, r.Revision+1), bytes.NewReader([]byte("chunk")), 5, Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	last := now
	var want []time.Time
	// The hourly tier: the 24 newest hours, which hold the 6 newest snapshots too.
	for h := range 24 {
		want = append(want, last.Add(-time.Duration(h)*time.Hour))
	}
	// The daily tier: the last day is the hourly tier's (the newest snapshot, at 23:20, is its
	// newest); the six days before it keep their 23:20.
	y, m, d := last.Date()
	for back := 1; back <= 6; back++ {
		want = append(want, time.Date(y, m, d-back, 23, 20, 0, 0, time.UTC))
	}
	objs, err := ls.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []time.Time
	revs := map[int64]bool{}
	for _, o := range objs {
		got = append(got, o.Time)
		revs[o.Revision] = true
	}
	slices.SortFunc(got, func(a, b time.Time) int { return b.Compare(a) })
	slices.SortFunc(want, func(a, b time.Time) int { return b.Compare(a) })
	if !slices.Equal(got, want) {
		t.Fatalf("after %d days of hourly snapshots, kept %d:\n%v\nwant %d:\n%v", days, len(got), got, len(want), want)
	}
	deltas, err := ls.ListDeltas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range deltas {
		if !revs[d.Base] {
			t.Errorf("chunk %s is left of a snapshot deleted", d.Name)
		}
		delete(revs, d.Base)
	}
	if len(revs) > 0 {
		t.Errorf("the chains of kept snapshots at revisions %v were deleted", revs)
	}
	t.Logf("%d days of hourly snapshots: %d kept (keep 6, hourly 24, daily 7), each with its chain", days, len(got))
}
