package sync

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"etcdops.dev/etcdops/api/v1alpha1"
)

// TLS on a running cluster.
//
// Turning TLS on or off is a roll like any other (one pod at a time, highest ordinal first,
// leadership moved away first), in stages, each a pod template rolled onto every pod before
// the next one is rendered. Which stage a cluster is in is read from the configuration its
// StatefulSet and its pods were rendered with (their etcd flags and Secret volumes), never
// remembered or guessed, so a sync that was lost or replayed changes nothing, and the planner
// resumes where the pods are.
//
// Client port (2379): plain → http+https → https to turn it on; the reverse to turn it off.
// etcd serves http and https on the same port when both are listed, telling them apart per
// connection, so clients keep working whichever they use while the pods roll. The hook asks
// each member over what its pod serves (the scheme the spec asks for when it serves both, so
// a member is seen answering over TLS before plain HTTP is dropped), and a stage is left only
// once every pod serves the next stage's scheme and every member answers healthy.
//
// Peer port (2380): etcd listens with one scheme per port, and a member reaches a peer over
// the scheme of the URL the peer advertises. Turning it on: first every pod gets the peer
// certificate while still listening on http (it can then reach a peer on https), then each pod
// is rolled onto an https listener and, once it listens there, its peer URL is updated in etcd
// (MemberUpdate, as etcd's guide for moving peers to TLS does) and the join state follows
// the membership. Turning it off is the reverse: each pod is rolled onto an http listener
// keeping the certificate, its URL is updated to http, and the certificate is dropped in a
// last roll once no member advertises https. A member's peer URL is thus only ever switched to
// a scheme its own pod listens with and every other member can reach.
//
// A new CA is a roll too: etcd reads its trusted CA file once, at start, while it reloads its
// own certificate and key on every handshake. The pod template carries a digest of the CA
// bundles it trusts (AnnotationTrust), so a changed ca.crt rolls the pods and a renewed leaf
// certificate does not.

// tlsView is the TLS side of one observation.
type tlsView struct {
	// want is the spec's end state; running the observed StatefulSet's template (nil when
	// there is none); desired the template to render in this sync.
	want    serving
	running *serving
	desired serving
	// clientSecret is the client certificate the hook and the member Jobs present: the
	// spec's, or while a pod still serves TLS after it left the spec, the one status kept.
	clientSecret string
	// waiting says why a TLS change cannot go on (a Secret is missing, or members would
	// reject its certificate), or ""; waitingBy is the Degraded reason for it.
	waiting, waitingBy string
}

// newTLSView decides the template's TLS stage for each port from the spec, the StatefulSet's
// template and the pods (see the comment at the top of this file).
func newTLSView(v *view) tlsView {
	t := tlsView{want: wantedServing(v.c)}
	if v.sts != nil {
		if s, ok := stsServing(v.sts); ok {
			t.running = &s
		}
	}
	prev := v.obs.Cluster.Status.TLS
	if prev == nil {
		prev = &v1alpha1.TLSStatus{}
	}
	// Nothing rendered yet, or nothing known of what the pods serve: no change to roll through.
	fresh := t.running == nil && !v.anyPod(func(serving) bool { return true })
	t.desired.client = t.clientStage(v, fresh)
	t.desired.peer = t.peerStage(v, fresh)

	// A Secret that left the spec is still mounted while a stage needs it: it is the one
	// the pods run with.
	if t.desired.client != clientPlain {
		t.desired.serverSecret = cmp.Or(t.want.serverSecret, t.runningSecret(volumeServerTLS), prev.ServerSecret)
	}
	if t.desired.peer != peerPlain {
		t.desired.peerSecret = cmp.Or(t.want.peerSecret, t.runningSecret(volumePeerTLS), prev.PeerSecret)
	}
	if v.c.Spec.TLS != nil && v.c.Spec.TLS.ClientSecret != "" {
		t.clientSecret = v.c.Spec.TLS.ClientSecret
	} else if t.desired.client != clientPlain || v.anyPod(func(s serving) bool { return s.client.servesTLS() }) {
		t.clientSecret = prev.ClientSecret
	}
	t.desired.trust = t.trust(v)
	return t
}

func (t *tlsView) runningSecret(volume string) string {
	if t.running == nil {
		return ""
	}
	if volume == volumeServerTLS {
		return t.running.serverSecret
	}
	return t.running.peerSecret
}

// clientStage is the client port's stage to render. A stage is left only for the next one
// (never plain to https or back in one roll), and only once every pod serves the scheme the
// next stage keeps and every member answers healthy.
func (t *tlsView) clientStage(v *view, fresh bool) clientMode {
	want := t.want.client
	switch {
	case fresh, t.running != nil && t.running.client == want, v.allPods(func(s serving) bool { return s.client == want }):
		return want
	case want == clientTLS && !v.hasSecret(t.want.serverSecret):
		t.wait(fmt.Sprintf("spec.tls.serverSecret %s is not there (or has no %s): client TLS is turned on once it is", t.want.serverSecret, secretCAKey), ReasonTLSSecretMissing)
		return t.runningClient()
	case want == clientTLS && v.certProblem(t.want.serverSecret, v.c.Spec.TLS.ClientSecret) != "":
		t.wait(v.certProblem(t.want.serverSecret, v.c.Spec.TLS.ClientSecret)+": client TLS is turned on once members would accept it", ReasonTLSCertificate)
		return t.runningClient()
	case want == clientTLS && v.settledForTLS() && v.allPods(func(s serving) bool { return s.client.servesTLS() }):
		return clientTLS
	case want == clientPlain && v.settledForTLS() && v.allPods(func(s serving) bool { return s.client.servesPlain() }):
		return clientPlain
	}
	return clientBoth
}

func (t *tlsView) runningClient() clientMode {
	if t.running == nil {
		return clientPlain
	}
	return t.running.client
}

func (t *tlsView) runningPeer() peerMode {
	if t.running == nil {
		return peerPlain
	}
	return t.running.peer
}

// wait records the first reason a TLS change cannot go on.
func (t *tlsView) wait(why, reason string) {
	if t.waiting == "" {
		t.waiting, t.waitingBy = why, reason
	}
}

// peerStage is the peer port's stage to render. https is listened on only once every pod
// holds the peer certificate; the certificate is dropped only once no member advertises an
// https peer URL and no pod listens on https.
func (t *tlsView) peerStage(v *view, fresh bool) peerMode {
	want := t.want.peer
	switch {
	case fresh, t.running != nil && t.running.peer == want, v.allPods(func(s serving) bool { return s.peer == want }):
		return want
	case want == peerTLS && !v.hasSecret(t.want.peerSecret):
		t.wait(fmt.Sprintf("spec.tls.peerSecret %s is not there (or has no %s): peer TLS is turned on once it is", t.want.peerSecret, secretCAKey), ReasonTLSSecretMissing)
		return t.runningPeer()
	case want == peerTLS && v.certProblem(t.want.peerSecret) != "":
		t.wait(v.certProblem(t.want.peerSecret)+": peer TLS is turned on once members would accept it", ReasonTLSCertificate)
		return t.runningPeer()
	case want == peerTLS && v.settledForTLS() && v.allPods(func(s serving) bool { return s.peer.canDialTLS() }):
		return peerTLS
	case want == peerPlain && v.settledForTLS() && v.allPods(func(s serving) bool { return s.peer != peerTLS }) && !v.anyMemberAdvertisesTLS():
		return peerPlain
	}
	return peerDial
}

// trust is the digest of the CA bundles the desired template mounts. When one of them was not
// sent (Metacontroller lags, or the Secret is gone), or members would reject a certificate
// under the new bundle (a CA dropped while certificates it signed are still in use), the
// running template's digest is kept: such a Secret never rolls the pods.
func (t *tlsView) trust(v *view) string {
	var names []string
	if t.desired.client != clientPlain {
		names = append(names, t.desired.serverSecret)
	}
	if t.desired.peer != peerPlain {
		names = append(names, t.desired.peerSecret)
	}
	if len(names) == 0 {
		return ""
	}
	keep := t.running != nil && t.running.trust != ""
	h := sha256.New()
	for _, n := range names {
		ca, ok := v.obs.CAs[n]
		checked := []string{n}
		if n == t.desired.serverSecret {
			// Members verify the client certificate with the server Secret's bundle.
			checked = append(checked, t.clientSecret)
		}
		if p := v.certProblem(checked...); p != "" {
			t.wait(p+": the pods keep the CAs they trust", ReasonTLSCertificate)
			ok = false
		}
		if !ok && keep {
			return t.running.trust
		}
		fmt.Fprintf(h, "%s=%s\n", n, ca)
	}
	return hex.EncodeToString(h.Sum(nil))[:10]
}

// certProblem is the first problem CertificateCheck found with one of the Secrets.
func (v *view) certProblem(names ...string) string {
	for _, n := range names {
		if p := v.obs.CertProblems[n]; n != "" && p != "" {
			return p
		}
	}
	return ""
}

// hasSecret: the hook was sent the Secret, with a CA bundle.
func (v *view) hasSecret(name string) bool {
	ca, ok := v.obs.CAs[name]
	return ok && ca != ""
}

// settledForTLS: every pod the StatefulSet should have is there, not going away and Ready,
// and every member is a healthy started voter: a TLS stage may be left.
func (v *view) settledForTLS() bool {
	if v.sts == nil || len(v.learners()) > 0 || len(v.members) != v.replicas {
		return false
	}
	for ord := 0; ord < v.replicas; ord++ {
		p, m := v.pods[ord], v.byOrd[ord]
		if p == nil || isTerminating(p) || !isReady(p) || m == nil || !m.Started() || !m.Healthy {
			return false
		}
	}
	return true
}

// allPods: at least one pod, and every pod serves what ok accepts; anyPod: some pod does.
func (v *view) allPods(ok func(serving) bool) bool {
	if len(v.pods) == 0 {
		return false
	}
	for _, p := range v.pods {
		if s, found := podServing(p); !found || !ok(s) {
			return false
		}
	}
	return true
}

func (v *view) anyPod(ok func(serving) bool) bool {
	for _, p := range v.pods {
		if s, found := podServing(p); found && ok(s) {
			return true
		}
	}
	return false
}

func (v *view) anyMemberAdvertisesTLS() bool {
	for _, m := range v.members {
		for _, u := range m.PeerURLs {
			if strings.HasPrefix(u, "https://") {
				return true
			}
		}
	}
	return false
}

// peerURLs: a member whose peer URL in etcd does not use the scheme its pod listens with
// was just rolled onto the other stage of a peer TLS change: its peers cannot reach it at the
// URL they know. The URL is updated in etcd (a member Job), the highest ordinal first, once
// every other member can reach the new one; the join state follows the membership.
func (p *planner) peerURLs() (step, bool) {
	for i := len(p.members) - 1; i >= 0; i-- {
		m := p.members[i]
		url, ok := p.listenedPeerURL(m)
		if !ok || slices.Equal(m.PeerURLs, []string{url}) {
			continue
		}
		if who := p.unreachableBy(m, url); who != "" {
			return p.wait(m.name, fmt.Sprintf("member %s listens at %s, but %s has no peer certificate to reach it there yet", m.name, url, who), resyncSoon), true
		}
		return p.runJob(memberJob{verb: verbUpdatePeerURL, member: m.name, id: m.ID, peerURL: url}, UpdatePeerURL,
			fmt.Sprintf("member %s listens for peers at %s, but etcd knows it at %s: updating its peer URL", m.name, url, strings.Join(m.PeerURLs, ","))), true
	}
	return step{}, false
}

// newMemberPeerURL is the peer URL a member added at ord gets: the scheme its pod listens
// with when the pod is there, else the template's; https only when every member reaches it.
func (p *planner) newMemberPeerURL(ord int) string {
	name := PodName(p.c.Name, ord)
	secure := p.tls.desired.peer == peerTLS
	if pod := p.pods[ord]; pod != nil && !isTerminating(pod) {
		if s, ok := podServing(pod); ok {
			secure = s.peer == peerTLS
		}
	}
	url := peerURLOf(p.c, name, p.cfg.ClusterDomain, secure)
	if p.unreachableBy(nil, url) != "" {
		return peerURLOf(p.c, name, p.cfg.ClusterDomain, false)
	}
	return url
}

// tlsWaiting: nothing else to do, but a TLS change is not done: it waits for its Secret,
// or for its next stage, which starts once every pod is Ready and every member healthy.
func (p *planner) tlsWaiting() (step, bool) {
	if p.tls.waiting != "" {
		s := p.wait("", p.tls.waiting, resyncHold)
		s.degraded, s.degradedBy = p.tls.waiting, p.tls.waitingBy
		return s, true
	}
	d, w := p.tls.desired, p.tls.want
	if d.client == w.client && d.peer == w.peer {
		return step{}, false
	}
	return p.wait("", p.tlsChange("TLS")+": stage rolled out; the next starts once every pod is Ready and every member is a healthy voter", resyncSoon), true
}

// tlsChange names the TLS change the template rolls, or returns what when there is none.
func (v *view) tlsChange(what string) string {
	d, w := v.tls.desired, v.tls.want
	var parts []string
	switch {
	case d.client == clientBoth && w.client == clientTLS:
		parts = append(parts, "client TLS on, stage 1 of 2 (http and https)")
	case d.client == clientBoth:
		parts = append(parts, "client TLS off, stage 1 of 2 (http and https)")
	case v.anyPod(func(s serving) bool { return s.client != d.client }):
		parts = append(parts, fmt.Sprintf("client TLS %s, stage 2 of 2 (%s)", onOff(d.client == clientTLS), d.client))
	}
	switch {
	case d.peer == peerDial && w.peer == peerTLS:
		parts = append(parts, "peer TLS on, stage 1 of 2 (peer certificates on every member)")
	case d.peer == peerDial:
		parts = append(parts, "peer TLS off, stage 1 of 2 (peers back on http)")
	case v.anyPod(func(s serving) bool { return s.peer != d.peer }):
		parts = append(parts, fmt.Sprintf("peer TLS %s, stage 2 of 2 (%s)", onOff(d.peer == peerTLS), d.peer))
	}
	if len(parts) == 0 {
		return what
	}
	return strings.Join(parts, ", ")
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// checkTLSStep checks what a step does to TLS: a pod is exposed to a template only one stage
// away from what it serves, on https peers only when every other pod can reach them, without
// the peer certificate only when no member advertises https; and a peer URL is switched only
// to what the member's pod listens at and every other member reaches.
func checkTLSStep(v *view, s step, exposed []int) error {
	d := v.tls.desired
	for _, ord := range exposed {
		p := v.pods[ord]
		cur, ok := podServing(p)
		if !ok {
			continue
		}
		if cur.client == clientPlain && d.client == clientTLS || cur.client == clientTLS && d.client == clientPlain {
			return fmt.Errorf("replacing %s moves its client port from %s to %s in one roll", p.Name, cur.client, d.client)
		}
		// In ordinal order, so the same step always gets the same reason.
		for _, o := range slices.Sorted(maps.Keys(v.pods)) {
			other := v.pods[o]
			if o == ord {
				continue
			}
			if theirs, ok := podServing(other); d.peer == peerTLS && (!ok || !theirs.peer.canDialTLS()) {
				return fmt.Errorf("replacing %s onto an https peer listener while %s has no peer certificate", p.Name, other.Name)
			}
		}
		if d.peer == peerPlain && v.anyMemberAdvertisesTLS() && cur.peer != peerPlain {
			return fmt.Errorf("dropping the peer certificate of %s while a member advertises an https peer URL", p.Name)
		}
	}
	if s.job != nil && s.job.verb == verbAddLearner {
		if who := v.unreachableBy(nil, s.job.peerURL); who != "" {
			return fmt.Errorf("adding %s at %s, which %s cannot reach", s.job.member, s.job.peerURL, who)
		}
	}
	if s.job != nil && s.job.verb == verbUpdatePeerURL {
		ord, _ := Ordinal(v.c.Name, s.job.member)
		m := v.byOrd[ord]
		if m == nil {
			return fmt.Errorf("updating the peer URL of %s, which is not a member", s.job.member)
		}
		if url, ok := v.listenedPeerURL(m); !ok || url != s.job.peerURL {
			return fmt.Errorf("updating the peer URL of %s to %s, where its pod does not listen", m.name, s.job.peerURL)
		}
		if who := v.unreachableBy(m, s.job.peerURL); who != "" {
			return fmt.Errorf("updating the peer URL of %s to %s, which %s cannot reach", m.name, s.job.peerURL, who)
		}
	}
	return nil
}

// tlsRecord records status.tls.
func (v *view) tlsRecord(a *answer) { a.st.TLS = v.tlsStatus() }

// tlsStatus reports the stage rendered now and how far its roll got.
func (v *view) tlsStatus() *v1alpha1.TLSStatus {
	d := v.tls.desired
	if v.tls.want == (serving{}) && d.client == clientPlain && d.peer == peerPlain && v.tls.clientSecret == "" {
		return nil
	}
	st := &v1alpha1.TLSStatus{Client: d.client.String(), Peer: d.peer.String(),
		ServerSecret: d.serverSecret, PeerSecret: d.peerSecret, ClientSecret: v.tls.clientSecret}
	var parts []string
	if p := v.tlsProgress("client TLS", d.client == clientBoth, v.tls.want.client == clientTLS, func(s serving) bool { return s.client == d.client }); p != "" {
		parts = append(parts, p)
	}
	if p := v.tlsProgress("peer TLS", d.peer == peerDial, v.tls.want.peer == peerTLS, func(s serving) bool { return s.peer == d.peer }); p != "" {
		parts = append(parts, p)
	}
	if v.tls.waiting != "" {
		parts = append(parts, v.tls.waiting)
	}
	st.Progress = strings.Join(parts, "; ")
	return st
}

// tlsProgress describes one port's change: stage 1 while the template serves both ways, stage
// 2 while pods still serve otherwise than the final template; "" when the pods are done.
func (v *view) tlsProgress(what string, first, on bool, done func(serving) bool) string {
	rolled, behind := 0, false
	for _, p := range v.pods {
		s, ok := podServing(p)
		switch {
		case !ok || !done(s):
			behind = true
		case !isTerminating(p):
			rolled++
		}
	}
	pods := max(len(v.pods), v.replicas)
	if !first && !behind {
		return ""
	}
	stage := 2
	if first {
		stage = 1
	}
	return fmt.Sprintf("%s %s, stage %d of 2: %d of %d pods rolled", what, onOff(on), stage, rolled, pods)
}

// checkTLSChange refuses a spec that names another Secret than the one the running pods use
// for the same purpose: certificates from a CA the members do not trust would split them.
// The CRD refuses the same edit; this catches it when the CRD was bypassed or is older.
func checkTLSChange(obs *Observed, c *v1alpha1.EtcdCluster) error {
	var running *serving
	for i := range obs.Children.StatefulSets {
		if sts := &obs.Children.StatefulSets[i]; sts.Name == StatefulSetName(c.Name) {
			if s, ok := stsServing(sts); ok {
				running = &s
			}
		}
	}
	if running == nil || c.Spec.TLS == nil {
		return nil
	}
	var p []string
	if n, r := c.Spec.TLS.ServerSecret, running.serverSecret; n != "" && r != "" && n != r {
		p = append(p, fmt.Sprintf("spec.tls.serverSecret %s replaces %s, which the pods serve: renew the certificate inside %s instead (a new leaf is reloaded without a restart, a new CA rolls the pods), or turn client TLS off, wait for status.tls.client to be http, and turn it on with %s", n, r, r, n))
	}
	if n, r := c.Spec.TLS.PeerSecret, running.peerSecret; n != "" && r != "" && n != r {
		p = append(p, fmt.Sprintf("spec.tls.peerSecret %s replaces %s, which the pods use between members: renew the certificate inside %s instead, or turn peer TLS off, wait for status.tls.peer to be http, and turn it on with %s", n, r, r, n))
	}
	if n, r := c.Spec.TLS.ClientSecret, obs.Cluster.Status.TLS; n != "" && r != nil && r.ClientSecret != "" && n != r.ClientSecret {
		p = append(p, fmt.Sprintf("spec.tls.clientSecret %s replaces %s, which the operator presents: renew the certificate inside %s instead", n, r.ClientSecret, r.ClientSecret))
	}
	if len(p) == 0 {
		return nil
	}
	return &v1alpha1.InvalidSpecError{Problems: p}
}

// jobTLS: whether member Jobs reach the voters over https. A client connection uses one scheme
// for all its endpoints; while the client port rolls, every voter serves the scheme of the
// stage before or after, so the one the spec asks for is taken when all serve it.
func (v *view) jobTLS() bool {
	prefer := v.tls.want.client.servesTLS()
	serves := func(secure bool) bool {
		for _, m := range v.voters() {
			if m.pod == nil {
				continue
			}
			if s, ok := podServing(m.pod); ok && (secure && !s.client.servesTLS() || !secure && !s.client.servesPlain()) {
				return false
			}
		}
		return true
	}
	if serves(prefer) {
		return prefer
	}
	return !prefer
}
