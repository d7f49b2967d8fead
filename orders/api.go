package orders

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"idemgate/ledger"
)

// API is the HTTP order API downstream: orders live in another
// system, reached over HTTP with the contract documented in docs/order-api.md.
// Every call is bounded by Timeout and made exactly once: the transport
// keeps no idle connections, so Go's HTTP client has no reused connection
// to silently retry a request on; every retry is idemgate's own, visible in
// the ledger's attempts and the audit log.
//
// Its writes (Create, Update, Cancel) carry the Idempotency-Key
// IdempotencyKey(tenant, ref) of the operation named ref; Lookup asks the
// API which order a write with that key made. Safe for concurrent use.
type API struct {
	base   *url.URL
	client *http.Client
	// safeRetry: see SafeRetry.
	safeRetry bool
	// lookups coalesces concurrent lookups of one key (Lookup).
	lookups singleflight.Group
}

// NewAPI returns a client for the API at base (http or https). timeout
// bounds one call (10s when <= 0); safeRetry is SafeRetry's answer.
func NewAPI(base string, timeout time.Duration, safeRetry bool) (*API, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("orders API URL %q: want http(s)://host[:port][/path]", base)
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		DisableKeepAlives:     true, // no reused connection, so no hidden transport retry
		ResponseHeaderTimeout: timeout,
	}
	return &API{base: u, client: &http.Client{Transport: tr, Timeout: timeout}, safeRetry: safeRetry}, nil
}

// WrapTransport wraps the client's transport with wrap (a tracing
// transport: see telemetry.Provider.Transport). Call it before the first
// request; the wrapper must pass each request to the transport it wraps
// once, and its error back as it is, or the failure classes are lost.
func (a *API) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	a.client.Transport = wrap(a.client.Transport)
}

// SafeRetry says the API guarantees that a request repeated with the same
// Idempotency-Key and body returns the first outcome instead of acting
// twice. Only then may an operation proven absent by the lookup be re-sent
// without a human.
func (a *API) SafeRetry() bool { return a.safeRetry }

// Downstream names the API in the ledger's records: "orders_api" and its
// base URL.
func (a *API) Downstream() string { return "orders_api " + a.base.String() }

// Failure classes of a downstream call.
const (
	// NotSent: the request never left (dial refused, DNS failure, not
	// written) or was refused before any work (429): retryable.
	NotSent = "not_sent"
	// Definitive: the API answered that it did not and will not do it.
	Definitive = "definitive"
	// Indeterminate: it may or may not have happened (timeout after the
	// request was written, connection reset, 5xx, 409 in progress).
	Indeterminate = "indeterminate"
)

// APIError is a failed call to the order API, classified.
type APIError struct {
	Class  string
	Status int         // HTTP status, 0 when none was received
	Code   ledger.Code // the error code of a definitive failure
	Msg    string
	// RetryAfter is the delay the API asked for with Retry-After on a 429
	// or 503 (0 when it named none).
	RetryAfter time.Duration
	// System names the API in Error ("" for the orders API).
	System string
}

func (e *APIError) Error() string {
	sys := e.System
	if sys == "" {
		sys = "orders API"
	}
	if e.Status != 0 {
		return fmt.Sprintf("%s: %s (HTTP %d): %s", sys, e.Class, e.Status, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", sys, e.Class, e.Msg)
}

// ErrAbsent is returned by Lookup when no request with the key took effect.
var ErrAbsent = errors.New("orders API: no order for this idempotency key")

// IdempotencyKey is the Idempotency-Key sent for an operation named ref
// ("<key>:<incarnation>", or the key alone for a record written before
// incarnations existed), and the key its lookup asks for. The tenant is
// part of it, so two tenants' keys never meet at a shared API; the
// incarnation is, so an operation under a key reused after its tombstone
// was deleted is never answered with the order an earlier operation under
// that key made, however long the API remembers its keys.
func IdempotencyKey(tenant, ref string) string { return tenant + ":" + ref }

// HTTPCall describes one request the client made, as reported to the
// observer of its context (WithObserver).
type HTTPCall struct {
	Method   string
	Path     string // the URL path, without the query
	Status   int    // the HTTP status, 0 when none was received
	Failure  string // the failure class (NotSent, Definitive, Indeterminate), "" on success
	Duration time.Duration
}

type observerKey struct{}

// WithObserver returns a context under which every request the client
// makes is reported to observe when it ends (for an audit of downstream
// calls). observe may be called from several goroutines at once.
func WithObserver(ctx context.Context, observe func(HTTPCall)) context.Context {
	return context.WithValue(ctx, observerKey{}, observe)
}

// do sends one request and decodes a 2xx JSON answer into out. The
// request's method, path, status and duration are reported to the
// context's observer (WithObserver).
func (a *API) do(ctx context.Context, method, path string, query url.Values, headers map[string]string, body any, out any) error {
	u := *a.base
	u.Path += path
	u.RawQuery = query.Encode()
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	h := http.Header{}
	h.Set("Accept", "application/json")
	if body != nil {
		h.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		h.Set(k, v)
	}
	resp, err := Send(ctx, a.client, method, u.String(), h, b, nil)
	if err != nil {
		return err
	}
	if out != nil {
		if err := json.Unmarshal(resp.Body, out); err != nil {
			return &APIError{Class: Indeterminate, Status: resp.Status, Msg: "the answer is not the expected JSON: " + err.Error()}
		}
	}
	return nil
}

// Response is a 2xx answer Send received: its status, headers and body
// (at most MaxBody bytes).
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// MaxBody bounds the answer Send reads: a longer one is cut there.
const MaxBody = 4 << 20

// Send makes one HTTP request with client, exactly once (the client's
// transport must keep no idle connections, or Go may resend it on a
// reused one without saying), and classifies what became of it: a 2xx
// answer is returned; anything else is an *APIError whose Class says
// whether the request can have taken effect — NotSent when it was never
// written (or refused before any work), Definitive when the server
// answered that it did not do it, Indeterminate when it may have (the
// request was written and no answer came, the answer was cut, a 5xx).
// Statuses are classified by Classify with overrides (nil: none). The
// request's method, path, status and duration are reported to the
// context's observer (WithObserver). body nil sends none.
func Send(ctx context.Context, client *http.Client, method, rawURL string, header http.Header, body []byte, overrides map[int]string) (_ *Response, err error) {
	started := time.Now()
	status := 0
	path := rawURL
	if u, perr := url.Parse(rawURL); perr == nil {
		path = u.Path
	}
	defer func() {
		failure := ""
		var ae *APIError
		if errors.As(err, &ae) {
			failure = ae.Class
		}
		if observe, _ := ctx.Value(observerKey{}).(func(HTTPCall)); observe != nil {
			observe(HTTPCall{Method: method, Path: path, Status: status, Failure: failure, Duration: time.Since(started)})
		}
	}()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	var wrote atomic.Bool // set by the transport's goroutine
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) },
	})
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return nil, &APIError{Class: NotSent, Msg: err.Error()}
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		if !wrote.Load() {
			return nil, &APIError{Class: NotSent, Msg: err.Error()}
		}
		return nil, &APIError{Class: Indeterminate, Msg: err.Error()}
	}
	defer resp.Body.Close()
	status = resp.StatusCode
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody))
	if err != nil {
		return nil, &APIError{Class: Indeterminate, Status: resp.StatusCode, Msg: "reading the answer: " + err.Error()}
	}
	if ae := Classify(resp.StatusCode, resp.Header, b, overrides, time.Now()); ae != nil {
		return nil, ae
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Classify is what an answer of status (with its headers and body) says
// of the request: nil for a 2xx; otherwise an *APIError whose Class is
// overrides[status] when set (NotSent, Definitive or Indeterminate), and
// by default NotSent for 429, Indeterminate for 409, 503 and every other
// 5xx, Definitive for every other status (404 as not_found, 412 as
// precondition_failed, the rest downstream_error). A 2xx is never
// overridden: it is the answer. Retry-After of a 429 or 503 is read
// relative to now.
func Classify(status int, h http.Header, body []byte, overrides map[int]string, now time.Time) *APIError {
	if status >= 200 && status < 300 {
		return nil
	}
	ae := &APIError{Status: status, Msg: snippet(body)}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		ae.RetryAfter = retryAfter(h.Get("Retry-After"), now)
	}
	switch {
	case status == http.StatusNotFound:
		ae.Class, ae.Code = Definitive, ledger.CodeNotFound
	case status == http.StatusPreconditionFailed:
		ae.Class, ae.Code = Definitive, ledger.CodePreconditionFailed
	case status == http.StatusTooManyRequests:
		ae.Class = NotSent
	case status == http.StatusConflict || status >= 500:
		ae.Class = Indeterminate
	default:
		ae.Class, ae.Code = Definitive, ledger.CodeDownstreamError
	}
	if c, ok := overrides[status]; ok {
		ae.Class = c
		if c == Definitive && ae.Code == "" {
			ae.Code = ledger.CodeDownstreamError
		}
		if c != Definitive {
			ae.Code = ""
		}
	}
	return ae
}

// maxRetryAfter bounds the delay a Retry-After may ask for: beyond it the
// API is down rather than busy, and a day is as much as advice can say.
const maxRetryAfter = 24 * time.Hour

// retryAfter parses a Retry-After header (delay-seconds or an HTTP date,
// RFC 9110 §10.2.3) into a delay from now, rounded up to whole seconds and
// at most maxRetryAfter; 0 when absent, unparseable or past.
func retryAfter(h string, now time.Time) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(h, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(h); err == nil {
		d = t.Sub(now)
	}
	if d <= 0 {
		return 0
	}
	return min((d + time.Second - 1).Truncate(time.Second), maxRetryAfter) // whole seconds, rounded up
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func writeHeaders(tenant, key string, version int) map[string]string {
	h := map[string]string{"Idempotency-Key": IdempotencyKey(tenant, key), "X-Idemgate-Tenant": tenant}
	if version > 0 {
		h["If-Match"] = strconv.Itoa(version)
	}
	return h
}

// Create places an order for the operation named ref. Errors are
// *APIError, classified.
func (a *API) Create(ctx context.Context, tenant, ref string, req CreateRequest) (*Order, error) {
	var o Order
	return &o, a.do(ctx, http.MethodPost, "/orders", nil, writeHeaders(tenant, ref, 0), req, &o)
}

// Update changes an order at req.ExpectedVersion (If-Match) for the
// operation named ref. Errors are *APIError, classified.
func (a *API) Update(ctx context.Context, tenant, ref string, req UpdateRequest) (*Order, error) {
	var o Order
	return &o, a.do(ctx, http.MethodPatch, "/orders/"+url.PathEscape(req.OrderID), nil, writeHeaders(tenant, ref, req.ExpectedVersion), req.Changes, &o)
}

// Cancel cancels an order at req.ExpectedVersion (If-Match) for the
// operation named ref. Errors are *APIError, classified.
func (a *API) Cancel(ctx context.Context, tenant, ref string, req CancelRequest) (*Order, error) {
	var o Order
	return &o, a.do(ctx, http.MethodPost, "/orders/"+url.PathEscape(req.OrderID)+"/cancel", nil, writeHeaders(tenant, ref, req.ExpectedVersion), map[string]string{"reason": req.Reason}, &o)
}

// Get reads an order; (nil, nil) when the API says 404.
func (a *API) Get(ctx context.Context, tenant, id string) (*Order, error) {
	var o Order
	err := a.do(ctx, http.MethodGet, "/orders/"+url.PathEscape(id), nil, map[string]string{"X-Idemgate-Tenant": tenant}, nil, &o)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return nil, nil
	}
	return &o, err
}

// List returns a customer's orders, newest first, and the API's cursor
// for the next page ("" on the last page). cursor is the API's own
// next_cursor from the previous page, sent back as the cursor parameter;
// an API that does not page answers without next_cursor.
func (a *API) List(ctx context.Context, tenant, customer string, limit int, cursor string) ([]*Order, string, error) {
	var r struct {
		Orders     []*Order `json:"orders"`
		NextCursor string   `json:"next_cursor"`
	}
	q := url.Values{"customer_id": {customer}, "limit": {strconv.Itoa(limit)}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	err := a.do(ctx, http.MethodGet, "/orders", q, map[string]string{"X-Idemgate-Tenant": tenant}, nil, &r)
	return r.Orders, r.NextCursor, err
}

// Lookup asks which order the request of the operation named ref created
// or changed: the order, ErrAbsent when none took effect, or an error when
// the API cannot tell now (ctx's error when ctx ends first).
//
// Concurrent lookups of one (tenant, key) are coalesced: one request is in
// flight and every caller gets its answer (a copy of the order). The
// request runs detached from the cancellation of the caller that started
// it — bounded by the API timeout — so that caller giving up does not fail
// the others.
func (a *API) Lookup(ctx context.Context, tenant, key string) (*Order, error) {
	detached := context.WithoutCancel(ctx)
	ch := a.lookups.DoChan(IdempotencyKey(tenant, key), func() (v any, err error) {
		defer recoverFlight(&err)
		return a.lookup(detached, tenant, key)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		o := *r.Val.(*Order)
		return &o, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// lookup is one lookup request; see Lookup.
func (a *API) lookup(ctx context.Context, tenant, key string) (*Order, error) {
	var o Order
	err := a.do(ctx, http.MethodGet, "/orders", url.Values{"idempotency_key": {IdempotencyKey(tenant, key)}}, map[string]string{"X-Idemgate-Tenant": tenant}, nil, &o)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return nil, ErrAbsent
	}
	if err != nil {
		return nil, err
	}
	return &o, nil
}

// recoverFlight turns a panic in a coalesced flight into its error:
// singleflight would re-raise it on a goroutine of its own and end the
// process.
func recoverFlight(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("panic in a coalesced call: %v", r)
	}
}
