package declared

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"idemgate/approvals"
	"idemgate/orders"
	"idemgate/schemas"
	"idemgate/tools"
)

// keyAdvice ends every declared tool's description: how the model uses
// operation_key.
const keyAdvice = " Safe to call again: operation_key names this one business intent. Get the key ONCE per intent from new_operation_key and reuse the SAME key on every retry — after a timeout, an error, or when unsure whether the first call went through; a retry returns the first call's result (replayed: true) and never does it twice. " +
	"Never mint a new key because a call failed or timed out. The same key with different arguments is refused."

// Tool is one declared tool, checked and ready: a tools.RemoteOp.
type Tool struct {
	decl      Decl
	schema    []byte // the input schema as published (operation_key added)
	url       *template
	headers   map[string]*template
	lookupURL *template
	lookupHdr map[string]*template
	curURL    *template
	curHdr    map[string]*template
	absent    []int
	overrides map[int]string
	secrets   map[string]string
	host      string // scheme://host of the request URL
	client    *http.Client
}

var _ tools.RemoteOp = (*Tool)(nil)

// build checks one declaration and makes its Tool.
func build(d Decl, env Environ) (*Tool, error) {
	var p problems
	if !nameRE.MatchString(d.Name) {
		p.add("name: %q is not a tool name (snake_case: a-z, 0-9, _, at most 64)", d.Name)
	}
	if d.Title == "" || len(d.Title) > maxTitle {
		p.add("title: required, at most %d bytes", maxTitle)
	}
	if d.Description == "" || len(d.Description) > maxDescription {
		p.add("description: required, at most %d bytes", maxDescription)
	}
	if d.Noun == "" {
		d.Noun = d.Name
	}
	if !nameRE.MatchString(d.Noun) || len(d.Noun) > maxNoun {
		p.add("noun: %q: snake_case, at most %d bytes", d.Noun, maxNoun)
	}
	switch d.Noun {
	case "order", "message", "resolution":
		p.add("noun: %q names a member the gate's own results use; choose another", d.Noun)
	}
	if d.Timeout.Duration < 0 || d.Timeout.Duration > 5*time.Minute {
		p.add("timeout: from 0 (the default, 10s) to 5m")
	}
	t := &Tool{decl: d, secrets: d.secrets(env, &p), overrides: d.Outcome.overrides(&p)}
	props := schemaProps{}
	if raw, err := d.readSchema(); err != nil {
		p.add("input_schema: %v", err)
	} else if t.schema, err = schemas.CheckRules(raw); err != nil {
		p.add("input_schema: %v", err)
	} else {
		props = propsOf(t.schema)
	}
	checkPointer(&p, "id", d.ID, false)

	// The request.
	switch d.Request.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		p.add("request.method: %q: POST, PUT, PATCH or DELETE (a side effect)", d.Request.Method)
	}
	var err error
	if t.url, err = parseTemplate(d.Request.URL, true); err != nil {
		p.add("request.url: %v", err)
	} else {
		u, _ := url.Parse(t.url.parts[0].literal)
		t.host = u.Scheme + "://" + u.Host
	}
	t.headers = t.parseHeaders("request.headers", d.Request.Headers, &p)
	if len(d.Request.Body) > maxBodyFields {
		p.add("request.body: more than %d fields", maxBodyFields)
	}
	for field, ptr := range d.Request.Body {
		checkPointer(&p, "request.body."+field, ptr, true)
		t.checkArgPointer(&p, props, "request.body."+field, ptr)
	}
	if d.Request.Method == http.MethodDelete && len(d.Request.Body) > 0 {
		p.add("request.body: a DELETE sends no body")
	}

	// The key.
	k := d.OperationKey
	n := 0
	for _, set := range []bool{k.Header != "", k.BodyField != "", k.None} {
		if set {
			n++
		}
	}
	switch {
	case n != 1:
		p.add("operation_key: say how the key reaches the API: exactly one of header = \"Idempotency-Key\", body_field = \"client_reference\", none = true")
	case k.Header != "" && !validHeader(k.Header):
		p.add("operation_key.header: %q is not a header name", k.Header)
	case k.BodyField != "" && d.Request.Method == http.MethodDelete:
		p.add("operation_key.body_field: a DELETE sends no body")
	case k.BodyField != "" && (len(k.BodyField) > 64 || strings.ContainsAny(k.BodyField, "/~")):
		p.add("operation_key.body_field: %q: one top-level field name", k.BodyField)
	case k.None && d.SafeRetry:
		p.add("safe_retry: an API that takes no key cannot act once on a repeated request")
	}
	if t.url != nil {
		t.url.names(phArg, func(name string) { t.checkTemplateArg(&p, props, "request.url", name) })
		t.url.names(phKey, func(string) {
			if k.None {
				p.add("request.url: {operation_key} with operation_key.none")
			}
		})
	}

	// The lookup.
	if l := d.Lookup; l != nil {
		if t.lookupURL, err = parseTemplate(l.URL, true); err != nil {
			p.add("lookup.url: %v", err)
		} else {
			t.lookupURL.names(phArg, func(name string) { t.checkTemplateArg(&p, props, "lookup.url", name) })
			uses := false
			t.lookupURL.names(phKey, func(string) { uses = true })
			if k.None && uses {
				p.add("lookup.url: {operation_key} with operation_key.none (the API never saw the key)")
			}
			if !k.None && !uses {
				p.add("lookup.url: must ask by {operation_key} (the key the request carried)")
			}
		}
		t.lookupHdr = t.parseHeaders("lookup.headers", l.Headers, &p)
		t.absent = l.AbsentStatus
		if len(t.absent) == 0 {
			t.absent = []int{http.StatusNotFound}
		}
		for _, s := range t.absent {
			if s < 300 || s > 599 {
				p.add("lookup.absent_status: %d is not an HTTP status from 300 to 599", s)
			}
		}
		checkPointer(&p, "lookup.items", l.Items, false)
		checkPointer(&p, "lookup.match", l.Match, false)
		checkPointer(&p, "lookup.result", l.Result, false)
		if l.Match != "" && l.Items == "" {
			p.add("lookup.match: only with lookup.items (a search answer)")
		}
		if l.Items != "" && l.Result != "" {
			p.add("lookup.result: not with lookup.items (the resource is the matching item)")
		}
		if k.None && l.Items != "" && l.Match != "" {
			p.add("lookup.match: compares with the key, which operation_key.none never sends")
		}
	} else if d.SafeRetry {
		p.add("safe_retry: without a lookup nothing can prove an operation absent")
	}

	// The current state.
	if c := d.Current; c != nil {
		if t.curURL, err = parseTemplate(c.URL, true); err != nil {
			p.add("current.url: %v", err)
		} else {
			t.curURL.names(phArg, func(name string) { t.checkTemplateArg(&p, props, "current.url", name) })
			t.curURL.names(phKey, func(string) { p.add("current.url: {operation_key}: the resource is named by the arguments") })
		}
		t.curHdr = t.parseHeaders("current.headers", c.Headers, &p)
		checkPointer(&p, "current.result", c.Result, false)
		checkPointer(&p, "current.version", c.Version, false)
	}

	// The policy.
	pol := d.Policy
	checkPointer(&p, "policy.amount", pol.Amount, false)
	checkPointer(&p, "policy.currency", pol.Currency, false)
	checkPointer(&p, "policy.recipient", pol.Recipient, false)
	t.checkArgPointer(&p, props, "policy.amount", pol.Amount)
	t.checkArgPointer(&p, props, "policy.currency", pol.Currency)
	t.checkArgPointer(&p, props, "policy.recipient", pol.Recipient)
	if pol.Amount != "" {
		if pp, ok := props[strings.TrimPrefix(pol.Amount, "/")]; ok && pp.typ != "integer" {
			p.add("policy.amount: %s is a %s; an amount is an integer of minor units", pol.Amount, pp.typ)
		}
	}
	if pol.ApprovalThresholdMinor < 0 || (pol.ApprovalThresholdMinor > 0 && pol.Amount == "") {
		p.add("policy.approval_threshold_minor: ≥ 0, and only with policy.amount")
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	timeout := d.Timeout.Duration
	if timeout == 0 {
		timeout = defaultTimeout
	}
	t.client = &http.Client{Timeout: timeout, Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		DisableKeepAlives:     true, // one request per attempt, never a hidden resend on a reused connection
		ResponseHeaderTimeout: timeout,
	}}
	return t, nil
}

func (t *Tool) parseHeaders(key string, hs map[string]string, p *problems) map[string]*template {
	if len(hs) > maxHeaders {
		p.add("%s: more than %d", key, maxHeaders)
	}
	out := map[string]*template{}
	for name, v := range hs {
		if !validHeader(name) {
			p.add("%s: %q is not a header name", key, name)
			continue
		}
		tpl, err := parseTemplate(v, false)
		if err != nil {
			p.add("%s.%s: %v", key, name, err)
			continue
		}
		tpl.names(phSecret, func(s string) {
			if _, ok := t.decl.Secrets[s]; !ok {
				p.add("%s.%s: {secret:%s} is not in [tools.secrets]", key, name, s)
			}
		})
		tpl.names(phArg, func(arg string) {
			p.add("%s.%s: {%s}: headers take {operation_key} and secrets, not arguments", key, name, arg)
		})
		out[name] = tpl
	}
	return out
}

func validHeader(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// checkTemplateArg: a URL placeholder names a required top-level argument
// of a plain type, so its expansion cannot fail.
func (t *Tool) checkTemplateArg(p *problems, props schemaProps, key, name string) {
	if t.schema == nil {
		return // the schema's own problem is reported
	}
	pp, ok := props[name]
	switch {
	case !ok:
		p.add("%s: {%s} is not an argument of the input schema", key, name)
	case !pp.required:
		p.add("%s: {%s} must be a required argument", key, name)
	case pp.typ != "string" && pp.typ != "integer" && pp.typ != "number" && pp.typ != "boolean":
		p.add("%s: {%s} is a %s; only strings, numbers and booleans stand in a URL", key, name, pp.typ)
	}
}

// checkArgPointer: a pointer into the arguments starts at a defined one.
func (t *Tool) checkArgPointer(p *problems, props schemaProps, key, ptr string) {
	if t.schema == nil || ptr == "" || !strings.HasPrefix(ptr, "/") {
		return
	}
	top, _, _ := strings.Cut(ptr[1:], "/")
	if _, ok := props[top]; !ok {
		p.add("%s: %s names no argument of the input schema", key, ptr)
	}
}

// propsOf reads the top-level properties of a checked schema.
func propsOf(schema []byte) schemaProps {
	var doc struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	_ = json.Unmarshal(schema, &doc)
	out := schemaProps{}
	for name, prop := range doc.Properties {
		typ, _ := prop.Type.(string)
		if typ == "" {
			typ = "value"
		}
		out[name] = struct {
			typ      string
			required bool
		}{typ, slices.Contains(doc.Required, name)}
	}
	return out
}

// Name is the tool's name.
func (t *Tool) Name() string { return t.decl.Name }

// InputSchema is the input schema as tools/list publishes it.
func (t *Tool) InputSchema() []byte { return t.schema }

// Spec is the tool as tools/list publishes it.
func (t *Tool) Spec() tools.Spec {
	destructive, openWorld := true, true
	if t.decl.Destructive != nil {
		destructive = *t.decl.Destructive
	}
	if t.decl.OpenWorld != nil {
		openWorld = *t.decl.OpenWorld
	}
	return tools.Spec{
		Name: t.decl.Name, Title: t.decl.Title, Description: strings.TrimSpace(t.decl.Description) + keyAdvice,
		Idempotent: true, Destructive: destructive, OpenWorld: openWorld, InputSchema: t.schema,
	}
}

// Declared is the tool for tools.Options.Declared: with a current
// state declared, its op is also a tools.CurrentReader.
func (t *Tool) Declared() tools.Declared {
	if t.curURL != nil {
		return tools.Declared{Spec: t.Spec(), Op: withCurrent{t}}
	}
	return tools.Declared{Spec: t.Spec(), Op: t}
}

// withCurrent is a Tool that reads the current state of what it changes.
type withCurrent struct{ *Tool }

var _ tools.CurrentReader = withCurrent{}

// Current implements tools.CurrentReader: the resource read, its
// version (the declared pointer, else the ETag), and the fields the
// request's body sets, before and after.
func (w withCurrent) Current(ctx context.Context, tenant string, args json.RawMessage) (*tools.Current, error) {
	t := w.Tool
	m, err := decodeArgs(args)
	if err != nil {
		return nil, err
	}
	u, err := t.curURL.expand(m, "", nil, true)
	if err != nil {
		return nil, err
	}
	h, err := expandHeaders(t.curHdr, "", t.secrets)
	if err != nil {
		return nil, err
	}
	h.Set("Accept", "application/json")
	h.Set("X-Idemgate-Tenant", tenant)
	resp, err := orders.Send(ctx, t.client, http.MethodGet, u, h, nil, nil)
	if err != nil {
		return nil, t.scrub(err)
	}
	doc, err := decodeArgs(wrap(resp.Body))
	if err != nil {
		return nil, fmt.Errorf("the current state is not JSON: %v", err)
	}
	res, ok := pointer(doc["v"], t.decl.Current.Result)
	if !ok {
		return nil, fmt.Errorf("the current state has nothing at %s", t.decl.Current.Result)
	}
	cur := &tools.Current{Version: resp.Header.Get("ETag"), Before: map[string]any{}, After: t.body(m)}
	if vp := t.decl.Current.Version; vp != "" {
		v, _ := pointer(res, vp)
		cur.Version, _ = scalar(v)
	}
	if t.decl.ID != "" {
		id, _ := pointer(res, t.decl.ID)
		cur.ID, _ = scalar(id)
	}
	obj, _ := res.(map[string]any)
	for k := range cur.After {
		cur.Before[k] = obj[k]
	}
	return cur, nil
}

// WrapTransport wraps the tool's HTTP transport (tracing). Call it before
// the first request; the wrapper must pass each request on once and its
// error back as it is.
func (t *Tool) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	t.client.Transport = wrap(t.client.Transport)
}

// Downstream implements tools.RemoteOp: "declared NAME scheme://host".
func (t *Tool) Downstream() string { return "declared " + t.decl.Name + " " + t.host }

// Noun implements tools.RemoteOp.
func (t *Tool) Noun() string { return t.decl.Noun }

// SafeRetry implements tools.RemoteOp.
func (t *Tool) SafeRetry() bool { return t.decl.SafeRetry }

// decodeArgs decodes saved arguments with numbers as json.Number.
func decodeArgs(args json.RawMessage) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

// Facts implements tools.RemoteOp: the amount, currency and recipient at
// the policy's pointers, and always_approve.
func (t *Tool) Facts(args json.RawMessage) (approvals.Facts, error) {
	m, err := decodeArgs(args)
	if err != nil {
		return approvals.Facts{}, err
	}
	pol := t.decl.Policy
	f := approvals.Facts{AlwaysApprove: pol.AlwaysApprove, ThresholdMinor: pol.ApprovalThresholdMinor}
	if f.ThresholdMinor == 0 {
		f.ThresholdMinor = -1 // no amount rule of its own, and not create_order's
	}
	if pol.Amount != "" {
		if v, ok := pointer(m, pol.Amount); ok {
			if n, ok := v.(json.Number); ok {
				if a, err := n.Int64(); err == nil {
					f.Amount, f.HasAmount = a, true
				}
			}
		}
	}
	if pol.Currency != "" {
		if v, ok := pointer(m, pol.Currency); ok {
			f.Currency, _ = v.(string)
		}
	}
	return f, nil
}

// Recipient is who a call is for (the policy's recipient pointer), ""
// when none is declared or given: approvers read it in the diff's
// headline ("create refund for pay_123").
func (t *Tool) Recipient(args map[string]any) string {
	if t.decl.Policy.Recipient == "" {
		return ""
	}
	v, ok := pointer(args, t.decl.Policy.Recipient)
	if !ok {
		return ""
	}
	s, err := scalar(v)
	if err != nil || len(s) > 200 {
		return ""
	}
	return s
}

// Send implements tools.RemoteOp: the declared request, carrying the key
// as declared.
func (t *Tool) Send(ctx context.Context, tenant, ref string, args json.RawMessage, ifMatch string) (*tools.RemoteResult, error) {
	key := orders.IdempotencyKey(tenant, ref)
	m, err := decodeArgs(args)
	if err != nil {
		return nil, &orders.APIError{Class: orders.NotSent, Msg: "the saved arguments do not decode: " + err.Error(), System: t.Downstream()}
	}
	u, err := t.url.expand(m, key, nil, true)
	if err != nil {
		return nil, &orders.APIError{Class: orders.NotSent, Msg: err.Error(), System: t.Downstream()}
	}
	h, err := expandHeaders(t.headers, key, t.secrets)
	if err != nil {
		return nil, &orders.APIError{Class: orders.NotSent, Msg: err.Error(), System: t.Downstream()}
	}
	if k := t.decl.OperationKey.Header; k != "" {
		h.Set(k, key)
	}
	h.Set("X-Idemgate-Tenant", tenant)
	if ifMatch != "" {
		h.Set("If-Match", ifMatch)
	}
	var body []byte
	if t.decl.Request.Method != http.MethodDelete {
		b := t.body(m)
		if f := t.decl.OperationKey.BodyField; f != "" {
			b[f] = key
		}
		if body, err = json.Marshal(b); err != nil {
			return nil, &orders.APIError{Class: orders.NotSent, Msg: err.Error(), System: t.Downstream()}
		}
		h.Set("Content-Type", "application/json")
	}
	resp, err := orders.Send(ctx, t.client, t.decl.Request.Method, u, h, body, t.overrides)
	if err != nil {
		return nil, t.scrub(err)
	}
	res, err := t.resource(resp.Body, "")
	if err != nil {
		return nil, &orders.APIError{Class: orders.Indeterminate, Status: resp.Status, Msg: err.Error(), System: t.Downstream()}
	}
	return res, nil
}

// body is the request's JSON body for the arguments m, without the key.
func (t *Tool) body(m map[string]any) map[string]any {
	b := map[string]any{}
	if len(t.decl.Request.Body) == 0 {
		for k, v := range m {
			if k != "operation_key" {
				b[k] = v
			}
		}
		return b
	}
	for field, ptr := range t.decl.Request.Body {
		if v, ok := pointer(m, ptr); ok {
			b[field] = v
		}
	}
	return b
}

// Lookup implements tools.RemoteOp.
func (t *Tool) Lookup(ctx context.Context, tenant, ref string, args json.RawMessage) (*tools.RemoteResult, error) {
	if t.lookupURL == nil {
		return nil, errors.New(t.decl.Name + " declares no lookup: an approver settles its unknown operations with resolve_operation")
	}
	key := orders.IdempotencyKey(tenant, ref)
	m, err := decodeArgs(args)
	if err != nil {
		return nil, err
	}
	u, err := t.lookupURL.expand(m, key, nil, true)
	if err != nil {
		return nil, err
	}
	h, err := expandHeaders(t.lookupHdr, key, t.secrets)
	if err != nil {
		return nil, err
	}
	h.Set("Accept", "application/json")
	h.Set("X-Idemgate-Tenant", tenant)
	// Every status but a 2xx is an error here; the absent ones say so.
	resp, err := orders.Send(ctx, t.client, http.MethodGet, u, h, nil, nil)
	if err != nil {
		var ae *orders.APIError
		if errors.As(err, &ae) && slices.Contains(t.absent, ae.Status) {
			return nil, orders.ErrAbsent
		}
		return nil, t.scrub(err)
	}
	l := t.decl.Lookup
	if l.Items == "" {
		return t.resource(resp.Body, l.Result)
	}
	doc, err := decodeArgs(wrap(resp.Body))
	if err != nil {
		return nil, fmt.Errorf("the lookup's answer is not JSON: %v", err)
	}
	v, _ := pointer(doc["v"], l.Items)
	items, ok := v.([]any)
	if v != nil && !ok {
		return nil, fmt.Errorf("the lookup's answer has no array at %s", l.Items)
	}
	for _, it := range items {
		if l.Match != "" {
			got, _ := pointer(it, l.Match)
			if got != key {
				continue
			}
		}
		b, err := json.Marshal(it)
		if err != nil {
			return nil, err
		}
		return t.resource(b, "")
	}
	return nil, orders.ErrAbsent
}

// wrap puts a JSON value under "v", so decodeArgs (objects only) takes
// any JSON answer.
func wrap(b []byte) json.RawMessage {
	return json.RawMessage(`{"v":` + string(bytes.TrimSpace(b)) + `}`)
}

// resource reads the API's answer b: the value at ptr ("" the whole) as
// the resource, and its id at the declaration's id pointer. An empty
// answer is a null resource.
func (t *Tool) resource(b []byte, ptr string) (*tools.RemoteResult, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return &tools.RemoteResult{Resource: json.RawMessage("null")}, nil
	}
	doc, err := decodeArgs(wrap(b))
	if err != nil {
		return nil, fmt.Errorf("the answer is not JSON: %v", err)
	}
	v, ok := pointer(doc["v"], ptr)
	if !ok {
		return nil, fmt.Errorf("the answer has nothing at %s", ptr)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	red := t.redact(out)
	if !json.Valid(red) {
		red = json.RawMessage(`"[an answer quoting a secret, withheld]"`)
	}
	r := &tools.RemoteResult{Resource: red}
	if t.decl.ID != "" {
		if id, ok := pointer(v, t.decl.ID); ok {
			r.ID, _ = scalar(id)
		}
	}
	return r, nil
}

func expandHeaders(hs map[string]*template, key string, secrets map[string]string) (http.Header, error) {
	h := http.Header{}
	for name, tpl := range hs {
		v, err := tpl.expand(nil, key, secrets, false)
		if err != nil {
			return nil, err
		}
		h.Set(name, v)
	}
	return h, nil
}

// scrub replaces the secrets in an error's message.
func (t *Tool) scrub(err error) error {
	var ae *orders.APIError
	if errors.As(err, &ae) {
		c := *ae
		c.Msg = string(t.redact([]byte(c.Msg)))
		c.System = t.Downstream()
		return &c
	}
	return err
}

// redact replaces every secret in b by [secret].
func (t *Tool) redact(b []byte) []byte {
	for _, s := range t.secrets {
		if len(s) >= 4 {
			b = bytes.ReplaceAll(b, []byte(s), []byte("[secret]"))
		}
	}
	return b
}

// Timeout bounds one request of the tool (its declared timeout).
func (t *Tool) Timeout() time.Duration { return t.client.Timeout }
