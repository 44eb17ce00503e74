package etcdbin

import (
	"strings"
	"testing"
)

// TestPinnedReleasesBuild builds (or finds cached) every pinned release and checks that each
// reports its version; the first run pays the builds, about a minute and a half each.
func TestPinnedReleasesBuild(t *testing.T) {
	for _, v := range append(Versions(), BelowUpgradeMinimum) {
		t.Run(v, func(t *testing.T) {
			bin, err := Path(v)
			if err != nil {
				t.Skipf("etcd %s cannot be built here, so the tests that run it skip: %v", v, err)
			}
			if ok, out := reports(bin, v); !ok {
				t.Errorf("%s reports %q", bin, out)
			}
		})
	}
}

func TestOnlyPinnedReleasesAreBuilt(t *testing.T) {
	if _, err := Path("v3.5.10"); err == nil || !strings.Contains(err.Error(), "not one of the pinned") {
		t.Errorf("Path(v3.5.10) = %v, want a refusal", err)
	}
}

// TestPinnedToolsBuild builds (or finds cached) etcdctl and etcdutl of every pinned minor
// and checks that each reports its release.
func TestPinnedToolsBuild(t *testing.T) {
	for _, v := range Versions() {
		t.Run(v, func(t *testing.T) {
			tools, err := ToolsFor(v)
			if err != nil {
				t.Skipf("etcdctl and etcdutl %s cannot be built here, so the tests that run them skip: %v", v, err)
			}
			for _, bin := range []string{tools.Etcdctl, tools.Etcdutl} {
				if !toolReports(bin, v) {
					t.Errorf("%s does not report %s", bin, v)
				}
			}
		})
	}
}
