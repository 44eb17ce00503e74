// Package harness runs the operator's whole loop on one machine for the end-to-end tests
// (test/e2e), the playground and, with the real API server, the control-plane tier: the
// real hook over HTTP and real etcd members (embedded on 127.0.0.x, or real etcd server
// processes of each supported release), with the parts of Kubernetes the loop needs played
// by code of its own. test/README.md, "What is real and what is played", says which is which
// and where each model has been checked against the real code.
//
// What it holds, by file:
//
//   - env.go: an Env, one cluster's whole world, its faults (Kill, Isolate, Partition, Wipe,
//     Drain) and its waits (WaitSteady); crash.go crashes the loop at step boundaries.
//   - store.go, gvk.go: the API server's part: one namespace's objects in memory, with
//     UIDs, generations, resource versions and the status subresource.
//   - metacontroller.go: the CompositeController's sync, finalize and customize calls as
//     Metacontroller v4.17.2 makes them, and what it does with the answer.
//   - statefulset.go, job.go, disruption.go, volumes.go: the StatefulSet, Job and disruption
//     controllers, claims and their growth.
//   - kubelet.go, dns.go, etcd.go, etcdproc.go, defrag.go, maintenance.go, tls.go: the
//     kubelet (pods as etcd members, probes, mounts refreshed late, pods Pending for pulls
//     and attaches), cluster DNS, the members themselves and what a test does to them.
//   - stream.go, backup.go, pitr.go: the continuous backup's Deployment and what backups hold.
//   - apinode.go, apicsi.go: a node and a CSI driver against a real API server (the
//     control-plane tier): the kubelet's part, and volumes provisioned and grown.
//   - monitor.go, workload.go, history.go, kvmodel.go, forks.go: the invariant monitor,
//     the workload that writes and watches, its history and the checks on it (no
//     acknowledged write lost, no second membership).
//   - operator.go: the hook server run in-process on a loopback port.
package harness
