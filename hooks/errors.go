package hooks

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5/middleware"
)

// Classes of bad requests. Handlers wrap one of these with the detail; statusOf maps them.
// Any other error is the hook's own fault.
var (
	errMalformed        = errors.New("malformed request")
	errUnprocessable    = errors.New("unprocessable request")
	errUnauthorized     = errors.New("unauthorized")
	errNotFound         = errors.New("not found")
	errMethodNotAllowed = errors.New("method not allowed")
	errNotReady         = errors.New("not ready")
)

// requestError is a refused request: its class (one of the errors above) and what exactly
// was wrong.
type requestError struct {
	class  error
	detail string
}

func (e *requestError) Error() string { return e.class.Error() + ": " + e.detail }
func (e *requestError) Unwrap() error { return e.class }

// refuse builds a requestError of class with a formatted detail.
func refuse(class error, format string, args ...any) error {
	return &requestError{class: class, detail: fmt.Sprintf(format, args...)}
}

// statusOf is the one place that maps an error to an HTTP status and the short error word of
// the JSON body. Metacontroller treats every non-200 as "apply nothing" and retries with
// backoff, so a refused request never deletes or changes a child.
func statusOf(err error) (int, string) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, "request body too large"
	case errors.Is(err, errMalformed):
		return http.StatusBadRequest, errMalformed.Error()
	case errors.Is(err, errUnprocessable):
		return http.StatusUnprocessableEntity, errUnprocessable.Error()
	case errors.Is(err, errUnauthorized):
		return http.StatusUnauthorized, errUnauthorized.Error()
	case errors.Is(err, errNotFound):
		return http.StatusNotFound, errNotFound.Error()
	case errors.Is(err, errMethodNotAllowed):
		return http.StatusMethodNotAllowed, errMethodNotAllowed.Error()
	case errors.Is(err, errNotReady):
		return http.StatusServiceUnavailable, errNotReady.Error()
	}
	return http.StatusInternalServerError, "internal error"
}

// writeError answers err as {"error", "detail"} with the status statusOf gives and logs it.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status, word := statusOf(err)
	detail := err.Error()
	var re *requestError
	if errors.As(err, &re) {
		detail = re.detail
	}
	level := slog.LevelWarn
	if status == http.StatusInternalServerError {
		level = slog.LevelError
	}
	log.LogAttrs(r.Context(), level, "request refused",
		slog.String("requestID", middleware.GetReqID(r.Context())),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.String("error", err.Error()))
	writeJSON(w, status, errorBody{Error: word, Detail: detail})
}

// writeJSON encodes v with a trailing newline, for curl users.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body := bodies.get()
	defer bodies.put(body)
	if err := json.NewEncoder(body).Encode(v); err != nil {
		status = http.StatusInternalServerError
		body.Reset()
		_ = json.NewEncoder(body).Encode(errorBody{Error: "internal error", Detail: "encoding the response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body.Bytes())
}
