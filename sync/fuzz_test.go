package sync

import (
	"testing"
	"time"

	"etcdops.dev/etcdops/api/v1alpha1"
	"etcdops.dev/etcdops/etcdstate"
)

// FuzzPlanner lets the fuzzer write the story: the first byte picks the size, volumes (bit 7
// clear), mounted files a minute or more late (bit 6) and hourly backups with daily restore
// drills (bit 5); each byte after it is one thing happening to a simulated cluster (a sync and
// a tick, a fault, a fault healed, a spec change, TLS on or off, a new CA, a child deleted, an
// observation of etcd that cannot be trusted, status lost, the backups' storage refusing, Jobs
// that act late).
// Every sync must plan without panicking and pass the invariant check (a violation is fatal
// here, not a hold), the same observation must plan to the same bytes, and the simulator's
// world checks (no second learner, no member Jobs at once, data kept by a quorum of voters, no
// member advertising a peer URL a running peer cannot reach) hold after every step. The corpus
// in testdata/fuzz/FuzzPlanner replays in every go test run.
func FuzzPlanner(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0, 6, 0, 0, 9, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 13, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0, 0, 0})
	f.Add([]byte{0x85, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 7, 0, 0, 0, 9, 11, 0, 0, 0, 14, 0, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 12, 12, 0, 0, 0, 8, 0, 0, 16, 0, 0, 17, 0, 0, 0, 0, 0})
	f.Add([]byte{0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 14, 0, 6, 26, 0, 0, 9, 0, 10, 0, 0, 0, 0})
	// Five members backed up, the storage refusing while a scale-in to three waits for its
	// snapshot, then healed.
	f.Add([]byte{0x22, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 19, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) == 0 || len(script) > 300 {
			return
		}
		w := newSimWorld(t, int32(1+script[0]%5), script[0]&0x80 == 0)
		w.faulty = true // faults may take quorum away; the data must survive regardless
		if script[0]&0x40 != 0 {
			// Mounted files reach each pod a minute or more late, as from a real kubelet.
			w.withMountDelays(60*time.Second, 20*time.Second)
		}
		if script[0]&0x20 != 0 {
			w.cluster.Spec.Backup = simBackupSpec("@hourly")
			w.cluster.Spec.Backup.Verify = &v1alpha1.BackupVerify{Schedule: "@daily"}
		}
		var healers []func()
		for i, b := range script[1:] {
			pick := func() *simPod {
				ords := sortedInts(w.pods)
				if len(ords) == 0 {
					return nil
				}
				return w.pods[ords[(int(b)/32+i)%len(ords)]]
			}
			switch b % 20 {
			case 6, 7, 8, 16:
				if p := pick(); p != nil {
					switch {
					case b%20 == 6:
						p.crash = true
					case b%20 == 7 && b >= 128:
						w.deafen(p) // removed, it runs on (sim_fork_test.go)
					case b%20 == 7:
						p.down = true
					case b%20 == 8 && b >= 128 && w.storage():
						// Its node goes: the replacement's volume does not attach until healed.
						ord := p.ord
						p.terminating, w.attaching[ord] = true, true
						healers = append(healers, func() { delete(w.attaching, ord) })
					case b%20 == 8:
						p.blind = true
					default:
						p.slow = true
					}
					healers = append(healers, func() { p.crash, p.down, p.blind, p.slow, p.deaf = false, false, false, false, false })
				}
			case 9:
				for _, h := range healers {
					h()
				}
				healers = nil
			case 10:
				w.cluster.Spec.Size = ptrTo(int32(1 + int(b)/20%5))
				w.cluster.Generation++
			case 11:
				w.cluster.Spec.Version = []string{"v3.6.16", "v3.6.17", "v3.6.18"}[int(b)/20%3]
				w.cluster.Generation++
			case 12:
				w.setTLS([]string{"none", "client", "peer", "client,peer"}[int(b)/20%4])
				w.cluster.Generation++
			case 13:
				w.etcdOverride = []func(*etcdstate.Snapshot){
					func(s *etcdstate.Snapshot) { *s = etcdstate.Snapshot{Err: "deadline exceeded"} },
					func(s *etcdstate.Snapshot) { s.Inconsistent = "two leaders" },
					func(s *etcdstate.Snapshot) { s.Complete = false },
				}[int(b)/20%3]
			case 14:
				// Without volumes the StatefulSet is deleted orphaning its pods: deleting them
				// with it loses the data, a mistake no operator can undo.
				w.deleteChild([]string{"configmap", "services", "pdb", "statefulset"}[int(b)/20%4], !w.storage() || b&1 == 1)
			case 15:
				w.secrets[simPeerSecret] = w.secrets[simPeerSecret] + "+"
			case 17:
				w.hideJobs = true
			case 18:
				w.failJobs = 1
			case 19:
				if b >= 128 {
					w.destination.refuses = true
					healers = append(healers, func() { w.destination.refuses = false })
					break
				}
				// Jobs act late from now on (sim_latency_test.go).
				w.latency = &simLatency{fixed: int(b) / 20 % 4}
			default:
				w.step()
			}
		}
		for _, h := range healers {
			h()
		}
		for range 5 {
			w.step()
		}
	})
}
