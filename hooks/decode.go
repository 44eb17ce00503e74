package hooks

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"etcdops.dev/etcdops/sync"
)

// syncRequest is the body of a sync or finalize call, decoded in one pass over the body:
// each child and related object goes straight into its typed struct. The parent is kept as
// raw bytes and decoded once the whole body has parsed, so that a malformed body is refused
// as malformed whatever its parent says. The controller object is not read.
type syncRequest struct {
	parent     json.RawMessage
	children   objectSets
	related    objectSets
	finalizing bool
	// unknownChild is the first child type with objects that this hook does not manage.
	unknownChild string
	// objectErr is the first child or related object that is not an object of its kind.
	objectErr error
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
	pods         map[string]*corev1.Pod
	secrets      map[string]*corev1.Secret
}

// readSyncRequest decodes the body as it arrives. A body that is not JSON, or whose outer
// structure is not a hook request's, is refused at once as malformed; the checks of what it
// holds come after, in the order the planner needs them (parent, child types, objects).
func readSyncRequest(r *http.Request) (syncRequest, error) {
	var req syncRequest
	dec := json.NewDecoder(r.Body)
	err := members(dec, "a sync request", func(key string) error {
		switch {
		case strings.EqualFold(key, "parent"):
			return decodeValue(dec, key, &req.parent)
		case strings.EqualFold(key, "children"):
			return members(dec, key, func(typ string) error { return req.children.decode(dec, typ, &req, true) })
		case strings.EqualFold(key, "related"):
			return members(dec, key, func(typ string) error { return req.related.decode(dec, typ, &req, false) })
		case strings.EqualFold(key, "finalizing"):
			return decodeValue(dec, key, &req.finalizing)
		}
		var skip json.RawMessage
		return decodeValue(dec, key, &skip)
	})
	if err == nil {
		if _, trailing := dec.Token(); trailing != io.EOF {
			err = refuse(errMalformed, "data after the request object")
		}
	}
	return req, bodyError(err)
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

// members calls f for each key of the JSON object dec is at, with dec at the key's value;
// null is an object without members.
func members(dec *json.Decoder, what string, f func(key string) error) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	switch t {
	case nil:
		return nil
	case json.Delim('{'):
	default:
		return refuse(errMalformed, "cannot unmarshal %s into %s: want an object", tokenKind(t), what)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		if err := f(t.(string)); err != nil {
			return err
		}
	}
	_, err = dec.Token()
	return err
}

func tokenKind(t json.Token) string {
	switch t.(type) {
	case json.Delim:
		if t == json.Delim('[') {
			return "array"
		}
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return fmt.Sprint(t)
}

// decodeValue decodes the value dec is at into v; a value of the wrong type is malformed.
func decodeValue(dec *json.Decoder, key string, v any) error {
	if err := dec.Decode(v); err != nil {
		if isSyntaxError(err) {
			return err
		}
		return refuse(errMalformed, "%s: %v", key, err)
	}
	return nil
}

// isSyntaxError tells an error of the body's JSON, after which the stream cannot be read on,
// from an error of one value's content.
func isSyntaxError(err error) bool {
	var syntax *json.SyntaxError
	return errors.As(err, &syntax) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.As(err, new(*http.MaxBytesError))
}

// decode reads the inner map of type typ into its set. A child type this hook does not
// manage is only counted; a related type it does not read is skipped.
func (s *objectSets) decode(dec *json.Decoder, typ string, req *syncRequest, children bool) error {
	switch {
	case children && typ == keyStatefulSet:
		return decodeSet(dec, typ, &s.statefulSets, req)
	case children && typ == keyService:
		return decodeSet(dec, typ, &s.services, req)
	case children && typ == keyConfigMap:
		return decodeSet(dec, typ, &s.configMaps, req)
	case children && typ == keyPDB:
		return decodeSet(dec, typ, &s.pdbs, req)
	case children && typ == keyJob:
		return decodeSet(dec, typ, &s.jobs, req)
	case !children && typ == keyPod:
		return decodeSet(dec, typ, &s.pods, req)
	case !children && typ == keySecret:
		return decodeSet(dec, typ, &s.secrets, req)
	}
	var other map[string]json.RawMessage
	if err := decodeValue(dec, typ, &other); err != nil {
		return err
	}
	if children && len(other) > 0 && req.unknownChild == "" {
		req.unknownChild = typ
	}
	return nil
}

// decodeSet decodes each object of one inner map into set; null entries are absent. An
// object that does not decode is remembered in req.objectErr and the rest read on.
func decodeSet[T any](dec *json.Decoder, typ string, set *map[string]*T, req *syncRequest) error {
	return members(dec, typ, func(key string) error {
		var obj *T
		if err := dec.Decode(&obj); err != nil {
			if isSyntaxError(err) {
				return err
			}
			if req.objectErr == nil {
				req.objectErr = refuse(errMalformed, "%s %q: %v", typ, key, err)
			}
			return nil
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
	out := make([]T, 0, len(set))
	for _, obj := range set {
		out = append(out, *obj)
	}
	slices.SortFunc(out, func(a, b T) int {
		pa, pb := P(&a), P(&b)
		return cmp.Or(cmp.Compare(pa.GetNamespace(), pb.GetNamespace()), cmp.Compare(pa.GetName(), pb.GetName()))
	})
	return out
}

// observedChildren are the request's children for the planner, once the child types have
// been checked.
func (req *syncRequest) observedChildren() (sync.Children, error) {
	if req.unknownChild != "" {
		return sync.Children{}, refuse(errUnprocessable, "children of type %q are not managed by this hook; remove that child resource from the CompositeController", req.unknownChild)
	}
	if req.objectErr != nil {
		return sync.Children{}, req.objectErr
	}
	return sync.Children{
		StatefulSets: sorted(req.children.statefulSets),
		Services:     sorted(req.children.services),
		ConfigMaps:   sorted(req.children.configMaps),
		PDBs:         sorted(req.children.pdbs),
		Jobs:         sorted(req.children.jobs),
	}, nil
}
