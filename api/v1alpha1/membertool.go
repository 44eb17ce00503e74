package v1alpha1

// AnnotationTakeMemberTool on an EtcdCluster asks its pods to take the member tool image the
// operator runs now, by a roll, when its value is that image (e.g.
// etcdops.dev/take-member-tool=etcdops/etcdops:v0.2.0). A new operator image alone rolls no
// etcd pod: the pods keep the tool they run until a roll for another reason, or this request.
// A value naming another image asks nothing, so a request left behind does not roll the
// cluster again at the next operator upgrade (docs/install.md, "Upgrade the operator").
const AnnotationTakeMemberTool = "etcdops.dev/take-member-tool"
