package tools

import (
	"encoding/json"
	"sync"

	"idemgate/schemas"
)

// preparedCalls remembers how the arguments of the latest side-effecting
// calls were prepared (schemas.Validator.Prepare) and encoded for the
// ledger, by the exact bytes the client sent: a retry — which under the
// idempotency contract sends the same arguments again — is validated,
// defaulted and fingerprinted by the first call's work instead of doing
// it again (two fifths of a replay's CPU in the tool service). Prepare is
// a function of the tool and the bytes alone, so the result is the one
// it would give; only arguments it accepted are kept, so a refusal is
// refused afresh every time. Safe for concurrent use; the zero value is
// ready.
type preparedCalls struct {
	mu sync.Mutex
	m  map[string]preparedCall // by tool name, NUL, arguments as sent
}

type preparedCall struct {
	req  *schemas.Request
	args json.RawMessage // req.Args as JSON (call.args)
}

// At most preparedKept calls are kept, each of arguments at most
// preparedMaxBytes as sent: a few MiB at worst.
const (
	preparedKept     = 1024
	preparedMaxBytes = 4096
)

// prepare is schemas.Validator.Prepare of tool's args, with the JSON of
// the prepared arguments (nil when not known yet). The Request is the
// caller's own; its Args map, shared with other calls, is only read.
func (p *preparedCalls) prepare(v *schemas.Validator, tool string, args any) (*schemas.Request, json.RawMessage, error) {
	var raw []byte
	switch a := args.(type) {
	case json.RawMessage:
		raw = a
	case []byte:
		raw = a
	}
	if raw == nil || len(raw) > preparedMaxBytes {
		req, err := v.Prepare(tool, args)
		return req, nil, err
	}
	id := tool + "\x00" + string(raw)
	p.mu.Lock()
	kept, ok := p.m[id]
	p.mu.Unlock()
	if ok {
		req := *kept.req
		return &req, kept.args, nil
	}
	req, err := v.Prepare(tool, args)
	if err != nil {
		return nil, nil, err
	}
	b, err := json.Marshal(req.Args)
	if err != nil {
		return req, nil, nil // encoded by the tool, which reports the error
	}
	kept = preparedCall{req: req, args: b}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]preparedCall)
	}
	if _, ok := p.m[id]; !ok && len(p.m) >= preparedKept {
		for old := range p.m { // any one: map order is random enough
			delete(p.m, old)
			break
		}
	}
	p.m[id] = kept
	own := *req
	return &own, b, nil
}
