package hooks

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/sync"
)

// syncRequest is the body of a sync or finalize call, decoded in one pass over the body:
// each child and related object goes straight into its typed struct. The parent is kept as
// raw bytes and decoded once the whole body has parsed, so that the parent's checks come
// first whatever the order of the body's members. The controller object is not read.
type syncRequest struct {
	parent     json.RawMessage
	children   objectSets
	related    objectSets
	finalizing bool
	// unknownChild is the first child type with objects that this hook does not manage.
	unknownChild string
	// podOptions decode the related pods (decodeSyncRequest).
	podOptions jsonv2.Options
}

// objectSets are the inner maps of children or related, by type key; within a type by the
// map's key (name in hook v1, namespace/name in v2), so a repeated key keeps its last value
// as a JSON object's would.
type objectSets struct {
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	pdbs         map[string]*policyv1.PodDisruptionBudget
	jobs         map[string]*batchv1.Job
	accounts     map[string]*corev1.ServiceAccount
	roles        map[string]*rbacv1.Role
	roleBindings map[string]*rbacv1.RoleBinding
	deployments  map[string]*appsv1.Deployment
	pods         map[string]*corev1.Pod
	secrets      map[string]*corev1.Secret
	claims       map[string]*corev1.PersistentVolumeClaim
	classes      map[string]*storagev1.StorageClass
}

// decodeOptions: the decoder validates and decodes in the same single pass (encoding/json
// scans every value twice, once to find its end and once to decode it). The names of children
// and related objects match case-sensitively, as the API server's own decoding does; the
// request's top-level keys and the parent match regardless of case, as encoding/json reads
// them (see readSyncRequest). Invalid UTF-8 is let through as
// encoding/json lets it. A name given twice in one object is refused: a request whose parent,
// spec or Secret says two things at once is read differently by decoders that keep the first
// and those that keep the last, so it is read neither way. Two types get decoders of their
// own (typeDecoders).
var decodeOptions = []jsonv2.Options{jsontext.AllowInvalidUTF8(true), typeDecoders}

// parentOptions read the parent exactly as encoding/json does (v1 semantics: names match
// regardless of case, unknown names ignored), with the same decoders of its own.
var parentOptions = []jsonv2.Options{jsonv1.DefaultOptionsV1(), typeDecoders}

var typeDecoders = jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(typeUnmarshalers...))

// typeUnmarshalers are typeDecoders' decoders; podOptions add their own to them.
var typeUnmarshalers = []*jsonv2.Unmarshalers{
	jsonv2.UnmarshalFromFunc(skipManagedFields),
	jsonv2.UnmarshalFromFunc(decodeTime),
}

// skipManagedFields leaves metadata.managedFields out: the planner never reads them, an
// observed child is answered without them, and they are often the largest part of an object.
func skipManagedFields(dec *jsontext.Decoder, _ *[]metav1.ManagedFieldsEntry) error {
	return dec.SkipValue()
}

// decodeTime reads a timestamp as metav1.Time's own UnmarshalJSON does (null is the zero
// time, else RFC 3339, in local time) without its round trip through encoding/json.
func decodeTime(dec *jsontext.Decoder, t *metav1.Time) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		t.Time = time.Time{}
		return nil
	case '"':
	default:
		return &jsonv2.SemanticError{JSONKind: tok.Kind(), GoType: reflect.TypeFor[metav1.Time](), Err: errors.New("want an RFC 3339 string")}
	}
	pt, err := time.Parse(time.RFC3339, tok.String())
	if err != nil {
		return &jsonv2.SemanticError{JSONKind: '"', GoType: reflect.TypeFor[metav1.Time](), Err: err}
	}
	t.Time = pt.Local()
	return nil
}

// readSyncRequest reads the body into body, then decodes it in one pass. The request's parent
// is part of body, so the request is good only while body is not reused. A body that is not
// JSON, whose outer structure is not a hook request's, or with an object that is not one of
// its kind is refused as malformed; the parent and the child types are checked after.
func readSyncRequest(r *http.Request, body *bytes.Buffer) (syncRequest, error) {
	var req syncRequest
	if _, err := body.ReadFrom(r.Body); err != nil {
		return req, bodyError(err)
	}
	return decodeSyncRequest(body, podOptions)
}

// decodeSyncRequest decodes a sync request's body, its related pods with pods: podOptions to
// read what the planner reads of them, typeDecoders to decode them whole.
func decodeSyncRequest(body *bytes.Buffer, pods jsonv2.Options) (syncRequest, error) {
	var req syncRequest
	req.podOptions = pods
	// From a bytes.Buffer the decoder parses in place, without copying into buffers of its own.
	dec := getDecoder(body)
	err := members(dec, "a sync request", func(key string) error {
		switch {
		case strings.EqualFold(key, "parent"):
			v, err := dec.ReadValue()
			// The decoder parses the body's own buffer in place, so v is part of it.
			req.parent = json.RawMessage(v)
			return err
		case strings.EqualFold(key, "children"):
			return members(dec, key, func(typ string) error { return req.children.decode(dec, typ, &req, true) })
		case strings.EqualFold(key, "related"):
			return members(dec, key, func(typ string) error { return req.related.decode(dec, typ, &req, false) })
		case strings.EqualFold(key, "finalizing"):
			return decodeValue(dec, key, &req.finalizing)
		}
		return dec.SkipValue()
	})
	return req, endOfBody(dec, err)
}

// readCustomizeRequest reads the body into body and takes the request's parent from it in one
// pass, by the rules readSyncRequest keeps; the parent is part of body, good while body is.
func readCustomizeRequest(r *http.Request, body *bytes.Buffer) (json.RawMessage, error) {
	if _, err := body.ReadFrom(r.Body); err != nil {
		return nil, bodyError(err)
	}
	dec := getDecoder(body)
	var parent json.RawMessage
	err := members(dec, "a customize request", func(key string) error {
		if strings.EqualFold(key, "parent") {
			v, err := dec.ReadValue()
			parent = json.RawMessage(v)
			return err
		}
		return dec.SkipValue()
	})
	return parent, endOfBody(dec, err)
}

// endOfBody ends a request read with err: it refuses data after the request object, returns
// dec to its pool and maps the error to the answer's class.
func endOfBody(dec *jsontext.Decoder, err error) error {
	if err == nil {
		if _, trailing := dec.ReadToken(); trailing != io.EOF {
			err = refuse(errMalformed, "data after the request object")
		}
	}
	putDecoder(dec)
	return bodyError(err)
}

// bodyError maps what reading and decoding the body failed with to the answer's class.
func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	var re *requestError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooLarge):
		return fmt.Errorf("the body exceeds %d bytes: %w", tooLarge.Limit, err)
	case errors.As(err, &re):
		return err
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return refuse(errMalformed, "unexpected end of JSON input")
	}
	return refuse(errMalformed, "%v", err)
}

// members calls f for each name of the JSON object dec is at, with dec at the member's value;
// null is an object without members.
func members(dec *jsontext.Decoder, what string, f func(name string) error) error {
	t, err := dec.ReadToken()
	if err != nil {
		return err
	}
	switch t.Kind() {
	case 'n':
		return nil
	case '{':
	default:
		return refuse(errMalformed, "cannot unmarshal %s into %s: want an object", kindName(t.Kind()), what)
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadToken()
		if err != nil {
			return err
		}
		if err := f(name.String()); err != nil {
			return err
		}
	}
	_, err = dec.ReadToken()
	return err
}

func kindName(k jsontext.Kind) string {
	switch k {
	case '[':
		return "array"
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "bool"
	}
	return k.String()
}

// decodeValue decodes the value dec is at into v; a value of the wrong type is malformed.
func decodeValue(dec *jsontext.Decoder, what string, v any) error {
	err := jsonv2.UnmarshalDecode(dec, v)
	var semantic *jsonv2.SemanticError
	if errors.As(err, &semantic) {
		return refuse(errMalformed, "%s: %v", what, err)
	}
	return err
}

// decode reads the inner map of type typ into its set. A child type this hook does not
// manage is only counted; a related type it does not read is skipped.
func (s *objectSets) decode(dec *jsontext.Decoder, typ string, req *syncRequest, children bool) error {
	switch {
	case children && typ == keyStatefulSet:
		return decodeSet(dec, typ, &s.statefulSets)
	case children && typ == keyService:
		return decodeSet(dec, typ, &s.services)
	case children && typ == keyConfigMap:
		return decodeSet(dec, typ, &s.configMaps)
	case children && typ == keyPDB:
		return decodeSet(dec, typ, &s.pdbs)
	case children && typ == keyJob:
		return decodeSet(dec, typ, &s.jobs)
	case children && typ == keyAccount:
		return decodeSet(dec, typ, &s.accounts)
	case children && typ == keyRole:
		return decodeSet(dec, typ, &s.roles)
	case children && typ == keyRoleBinding:
		return decodeSet(dec, typ, &s.roleBindings)
	case children && typ == keyDeployment:
		return decodeSet(dec, typ, &s.deployments)
	case !children && typ == keyPod:
		return decodeSet(dec, typ, &s.pods, req.podOptions)
	case !children && typ == keySecret:
		return decodeSet(dec, typ, &s.secrets)
	case !children && typ == keyClaim:
		return decodeSet(dec, typ, &s.claims)
	case !children && typ == keyClass:
		return decodeSet(dec, typ, &s.classes)
	case !children:
		return dec.SkipValue()
	}
	n := 0
	err := members(dec, typ, func(string) error { n++; return dec.SkipValue() })
	if n > 0 && req.unknownChild == "" {
		req.unknownChild = typ
	}
	return err
}

// decodeSet decodes each object of one inner map into set, with the decoder's options and
// opts; null entries are absent.
func decodeSet[T any](dec *jsontext.Decoder, typ string, set *map[string]*T, opts ...jsonv2.Options) error {
	return members(dec, typ, func(key string) error {
		var obj *T
		err := jsonv2.UnmarshalDecode(dec, &obj, opts...)
		var semantic *jsonv2.SemanticError
		if errors.As(err, &semantic) {
			return refuse(errMalformed, "%s %q: %v", typ, key, err)
		}
		if err != nil {
			return err
		}
		if *set == nil {
			*set = map[string]*T{}
		}
		if obj == nil {
			delete(*set, key)
			return nil
		}
		(*set)[key] = obj
		return nil
	})
}

// sorted returns the objects of set by namespace and name, so the planner sees the same order
// whatever the map's key style.
func sorted[T any, P interface {
	*T
	metav1.Object
}](set map[string]*T) []T {
	if len(set) == 0 {
		return nil
	}
	// Sorted as pointers: comparing copies would put two of them on the heap per comparison.
	objs := make([]P, 0, len(set))
	for _, obj := range set {
		objs = append(objs, obj)
	}
	slices.SortFunc(objs, func(a, b P) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	out := make([]T, len(objs))
	for i, obj := range objs {
		out[i] = *obj
	}
	return out
}

// sortedIn is sorted for the objects of namespace ns alone. Metacontroller's v2 hooks relate
// what a rule's label selector matches in every namespace unless the rule names one
// (relatedResources names it), and a cluster of the same name in another namespace carries
// the same labels: its pods and claims must never be taken for this cluster's.
func sortedIn[T any, P interface {
	*T
	metav1.Object
}](ns string, set map[string]*T) []T {
	objs := sorted[T, P](set)
	out := objs[:0]
	for i := range objs {
		if P(&objs[i]).GetNamespace() == ns {
			out = append(out, objs[i])
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// observedChildren are the request's children for the planner, once the child types have
// been checked.
func (req *syncRequest) observedChildren() (sync.Children, error) {
	if req.unknownChild != "" {
		return sync.Children{}, refuse(errUnprocessable, "children of type %q are not managed by this hook; remove that child resource from the CompositeController", req.unknownChild)
	}
	return sync.Children{
		StatefulSets: sorted(req.children.statefulSets),
		Services:     sorted(req.children.services),
		ConfigMaps:   sorted(req.children.configMaps),
		PDBs:         sorted(req.children.pdbs),
		Jobs:         sorted(req.children.jobs),
		Accounts:     sorted(req.children.accounts),
		Roles:        sorted(req.children.roles),
		RoleBindings: sorted(req.children.roleBindings),
		Deployments:  sorted(req.children.deployments),
	}, nil
}
