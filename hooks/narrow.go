package hooks

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	corev1 "k8s.io/api/core/v1"
)

// A related pod is decoded only as far as the planner reads it: its metadata whole, and of
// its spec and status the members podFields keep. The rest of a pod (its containers' env,
// ports, probes, resources and mounts, the projected token volume, the scheduling fields, the
// status's IPs and image IDs) is skipped unread, still checked as JSON (a skipped member of
// the wrong type is not refused, as nothing would read it). Pods are related
// objects: the planner never answers one back, so nothing it does not read is lost. Children
// (the StatefulSet, Jobs, ConfigMaps, Services) are decoded whole: a hold or an adopted child
// is answered as it was observed (sync/observed.go), every field of it.
//
// TestNarrowKeepsWhatIsRead fails when sync or hooks reads a field of these types that is
// not kept; TestNarrowPlansAlike plans every fixture and recorded request decoded both ways.
var podFields = []narrowing{
	keep[corev1.PodSpec]("containers", "initContainers", "volumes"),
	keep[corev1.Container]("name", "image", "command", "args"),
	keep[corev1.Volume]("name", "secret", "emptyDir"),
	keep[corev1.PodStatus]("phase", "conditions", "message", "reason", "podIP", "containerStatuses", "initContainerStatuses"),
	keep[corev1.ContainerStatus]("name", "state", "lastState", "ready", "restartCount"),
}

// podOptions decode a related pod: typeDecoders' decoders and podFields'.
var podOptions = func() jsonv2.Options {
	u := slices.Clone(typeUnmarshalers)
	for _, n := range podFields {
		u = append(u, n.unmarshal)
	}
	return jsonv2.WithUnmarshalers(jsonv2.JoinUnmarshalers(u...))
}()

// narrowing is a struct type decoded from the members keep names alone.
type narrowing struct {
	typ reflect.Type
	// fields are the kept members' indexes in typ, by JSON name.
	fields    map[string][]int
	unmarshal *jsonv2.Unmarshalers
}

// keep returns the narrowing of T to the members names: each must be a JSON name of T's (its
// inlined structs' included), else keep panics, so that a misspelt name fails every test.
func keep[T any](names ...string) narrowing {
	t := reflect.TypeFor[T]()
	all := jsonFields(t)
	fields := make(map[string][]int, len(names))
	for _, name := range names {
		i, ok := all[name]
		if !ok {
			panic(fmt.Sprintf("hooks: %v has no JSON member %q", t, name))
		}
		fields[name] = i
	}
	return narrowing{typ: t, fields: fields, unmarshal: jsonv2.UnmarshalFromFunc(func(dec *jsontext.Decoder, v *T) error {
		return decodeKept(dec, reflect.ValueOf(v).Elem(), fields)
	})}
}

// jsonFields are t's fields by JSON name as encoding/json and json v2 name them; an
// embedded struct without a name of its own (k8s's `json:",inline"`) lends its fields.
func jsonFields(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for _, f := range reflect.VisibleFields(t) {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" || (f.Anonymous && name == "") {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Index
	}
	return out
}

// decodeKept decodes the object dec is at into v, the members in fields alone, with the
// decoder's options (so podFields apply inside them too); null is the zero value, as json
// v2 decodes it into a struct.
func decodeKept(dec *jsontext.Decoder, v reflect.Value, fields map[string][]int) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		v.SetZero()
		return nil
	case '{':
	default:
		return &jsonv2.SemanticError{JSONKind: tok.Kind(), GoType: v.Type(), Err: errors.New("want an object")}
	}
	for dec.PeekKind() != '}' {
		name, err := dec.ReadValue()
		if err != nil {
			return err
		}
		var i []int
		var ok bool
		// Indexed with the conversion in place, the lookup copies no name.
		if raw := name[1 : len(name)-1]; bytes.IndexByte(raw, '\\') < 0 {
			i, ok = fields[string(raw)]
		} else {
			i, ok = fields[unescaped(name)]
		}
		if !ok {
			if err := dec.SkipValue(); err != nil {
				return err
			}
			continue
		}
		if err := jsonv2.UnmarshalDecode(dec, v.FieldByIndex(i).Addr().Interface()); err != nil {
			return err
		}
	}
	_, err = dec.ReadToken()
	return err
}

// unescaped is the name a raw JSON string with escapes names (a name the API server writes
// has none); the decoder has checked it already.
func unescaped(raw jsontext.Value) string {
	b, err := jsontext.AppendUnquote(nil, raw)
	if err != nil {
		return ""
	}
	return string(b)
}
