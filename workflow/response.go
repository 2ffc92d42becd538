package workflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/onceflow/onceflow/recovery"
)

// Response is what a workflow answers: a status, headers and body, stored
// verbatim and replayed to every retry.
type Response = recovery.Response

// JSON returns a response with status and v encoded as JSON. It panics if v
// cannot be encoded, a programming error; inside a workflow the panic is
// recovered like any other.
func JSON(status int, v any) Response {
	body, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("workflow.JSON: %v", err))
	}
	return Response{
		Status: status,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   body,
	}
}

// Problem returns an RFC 9457 problem response (application/problem+json)
// with the status's standard title and detail.
func Problem(status int, detail string) Response {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{"about:blank", http.StatusText(status), status, detail})
	return Response{
		Status: status,
		Header: http.Header{"Content-Type": {"application/problem+json"}},
		Body:   body,
	}
}

// outcome is the control-flow error Respond and Reject return.
type outcome struct {
	resp   Response
	reject bool
	abort  bool
}

func (o *outcome) Error() string {
	if o.abort {
		return fmt.Sprintf("workflow aborted with status %d", o.resp.Status)
	}
	if o.reject {
		return fmt.Sprintf("workflow rejected the request with status %d", o.resp.Status)
	}
	return fmt.Sprintf("workflow responded with status %d", o.resp.Status)
}

// Respond ends the workflow with a business outcome: the engine stores resp
// as the key's response, completes the key and replays resp to every retry.
// Returned from an atomic phase, the phase's writes commit with it (mark the
// order declined, answer 402). The steps after it do not run.
func Respond(resp Response) error { return &outcome{resp: resp} }

// Reject ends the workflow with resp and keeps no record, for a request
// refused before it changed anything (a validation error): the client may
// retry at once with the same key. Returned from an atomic phase, the
// phase's writes roll back. Once a step has committed, there are effects to
// answer for, and Reject acts as Respond.
func Reject(resp Response) error { return &outcome{resp: resp, reject: true} }

// Abort ends the workflow as a failure a step decided on (the order cannot
// be fulfilled, the charge does not match it): before the workflow's point
// of no return (Workflow.PointOfNoReturn), the engine undoes what its
// foreign steps did, running the compensation (foreign.Compensate) of each
// started one, latest first, then stores resp as the key's response; the
// record ends compensated. The step that aborts is not compensated, since
// it decided instead of acting, unless an earlier attempt (this one took
// the record over at that step) or an earlier foreign.Retry try of it may
// have called the other system: that call is undone. Returned from an
// atomic phase, the phase's
// writes commit with the decision (mark the order cancelled). After the
// point of no return nothing is undone: resp is stored and the record ends
// failed.
func Abort(resp Response) error { return &outcome{resp: resp, abort: true} }

// Final reports that the error is an answer, not a failure: a
// foreign.Retry does not try the call again.
func (o *outcome) Final() bool { return true }

func asOutcome(err error) (*outcome, bool) {
	var o *outcome
	ok := errors.As(err, &o)
	return o, ok
}
