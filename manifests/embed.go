// Package manifests holds the operator's Kubernetes manifests: the EtcdCluster
// CustomResourceDefinition, the CompositeController that hands EtcdClusters to the sync hook,
// the hook's Deployment and everything around it, and sample EtcdClusters. Its tests check
// them against the Go types, build the kustomization and install everything on a real
// API server.
//
// The CRD is generated from the kubebuilder markers in api/v1alpha1; regenerate it with
// go generate ./manifests after changing the types. The Helm chart in chart/ renders the same
// objects as the kustomization (and manifests/monitoring); Helm reads no file outside the
// chart, so go generate also copies the CRD and the monitoring objects into chart/files.
package manifests

import "embed"

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.20.1 crd paths=../api/... output:crd:dir=metacontroller/crd
//go:generate cp metacontroller/crd/etcdops.dev_etcdclusters.yaml monitoring/prometheusrule.yaml monitoring/members-prometheusrule.yaml monitoring/backup-prometheusrule.yaml monitoring/hook-podmonitor.yaml monitoring/podmonitor.yaml monitoring/backup-stream-podmonitor.yaml monitoring/dashboard.json chart/files/

// FS holds manifests/metacontroller as it ships: the kustomization, its resources and the
// samples.
//
//go:embed metacontroller
var FS embed.FS
