// Package sync is the operator's functional core: from one observation of an EtcdCluster, its
// children, its pods and its etcd membership, it decides the one next step and renders the
// complete set of desired children. It does no I/O and reads no clock.
package sync
