package e2e

// A fake HTTP order API and a fake notification gateway for the
// fault-injection suite (faults_test.go, crashloop_test.go). The fake order
// API implements the contract idemgate's client expects (orders/api.go,
// docs/order-api.md), counts every real side effect, and injects the
// faults of seed 004 on demand: a queue of faults, each consumed by the next
// request it matches, plus a few standing conditions (connections refused,
// connections not accepted, lookup unavailable).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Faults

// faultKind names one injected fault.
type faultKind string

const (
	// Fail500BeforeCommit answers 500 and does nothing.
	Fail500BeforeCommit faultKind = "500_before_commit"
	// Fail500AfterCommit commits, then answers 500.
	Fail500AfterCommit faultKind = "500_after_commit"
	// DropReplyAfterCommit commits, then closes the connection without
	// answering.
	DropReplyAfterCommit faultKind = "drop_reply_after_commit"
	// DelayAfterCommit commits, then sleeps Delay (past the client's
	// timeout) before answering.
	DelayAfterCommit faultKind = "delay_after_commit"
	// DelayBeforeCommit sleeps Delay before committing; if the client hung
	// up meanwhile the request is abandoned uncommitted (the API never
	// accepted it), unless CommitAnyway.
	DelayBeforeCommit faultKind = "delay_before_commit"
	// ResetMidResponse commits, writes the status line, headers and half
	// the body, and resets the connection.
	ResetMidResponse faultKind = "reset_mid_response"
	// Return409InProgress answers 409 "a request with this key is in
	// progress"; with CommitAnyway the in-flight twin it stands for commits
	// right after the answer is sent.
	Return409InProgress faultKind = "409_in_progress"
	// HoldBeforeCommit blocks before committing until Release; the request
	// then commits only if CommitAnyway or the client is still connected.
	HoldBeforeCommit faultKind = "hold_before_commit"
	// HoldAfterCommit commits and blocks until Release before answering.
	HoldAfterCommit faultKind = "hold_after_commit"
	// Unavailable503 answers 503 (for lookups: the API cannot tell now).
	Unavailable503 faultKind = "503_unavailable"
)

// Request classes a fault can match.
const (
	matchCreate = "create" // POST /orders
	matchUpdate = "update" // PATCH /orders/{id}
	matchCancel = "cancel" // POST /orders/{id}/cancel
	matchWrite  = "write"  // any of the three
	matchLookup = "lookup" // GET /orders?idempotency_key=
)

// fault is one queued fault.
type fault struct {
	Kind         faultKind
	Match        string        // a match* class
	Key          string        // only requests with this Idempotency-Key (or it + ":<incarnation>"); "" any
	Delay        time.Duration // DelayAfterCommit, DelayBeforeCommit
	CommitAnyway bool          // DelayBeforeCommit, HoldBeforeCommit, Return409InProgress
	hold         *hold
}

// hold is the rendezvous of a Hold* fault: Arrived is closed when the
// request reaches the hold point; Release lets it go on.
type hold struct {
	Arrived  chan struct{}
	release  chan struct{}
	gone     chan struct{} // closed when the held request's client hung up
	once     sync.Once
	goneOnce sync.Once
}

func newHold() *hold {
	return &hold{Arrived: make(chan struct{}), release: make(chan struct{}), gone: make(chan struct{})}
}

// arrive marks the request as held and watches its client.
func (h *hold) arrive(ctx context.Context) {
	close(h.Arrived)
	go func() {
		select {
		case <-ctx.Done():
			h.goneOnce.Do(func() { close(h.gone) })
		case <-h.release:
		}
	}()
}

// WaitGone blocks until the held request's client has hung up (its
// connection closed: the idemgate process died), or fails the test.
func (h *hold) WaitGone(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-h.gone:
	case <-time.After(timeout):
		t.Fatalf("the held request's client did not hang up within %v", timeout)
	}
}

// Release lets the held request continue (idempotent).
func (h *hold) Release() { h.once.Do(func() { close(h.release) }) }

// Wait blocks until the held request arrived or timeout passes.
func (h *hold) Wait(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-h.Arrived:
	case <-time.After(timeout):
		t.Fatalf("the held request did not reach the fake API within %v", timeout)
	}
}

// ---------------------------------------------------------------------------
// The fake order API

// fakeOrder is an order as the fake API stores and answers it (the JSON
// shape idemgate decodes into orders.Order).
type fakeOrder struct {
	OrderID               string          `json:"order_id"`
	Version               int             `json:"version"`
	Status                string          `json:"status"`
	CustomerID            string          `json:"customer_id"`
	Items                 []fakeItem      `json:"items"`
	Currency              string          `json:"currency"`
	TotalMinor            int64           `json:"total_minor"`
	ShipTo                json.RawMessage `json:"ship_to,omitempty"`
	RequestedDeliveryDate string          `json:"requested_delivery_date,omitempty"`
	Note                  string          `json:"note,omitempty"`
	CancelReason          string          `json:"cancel_reason,omitempty"`
	OperationKey          string          `json:"operation_key"`
	CreatedAt             time.Time       `json:"created_at"`
	UpdatedAt             time.Time       `json:"updated_at"`

	tenant string
	seq    int
}

type fakeItem struct {
	SKU            string `json:"sku"`
	Quantity       int64  `json:"quantity"`
	UnitPriceMinor int64  `json:"unit_price_minor"`
}

// keyEntry is what the fake remembers of an Idempotency-Key that took
// effect: the request it was for and the answer it gave.
type keyEntry struct {
	op      string // create, update, cancel
	target  string // order id for update/cancel
	body    string // canonical JSON of the request body
	tenant  string
	orderID string
	answer  []byte // the order as answered when it committed
}

// apiStats is a snapshot of the fake's counters.
type apiStats struct {
	Requests      int            // every request
	WriteRequests int            // POST/PATCH writes received
	Created       int            // orders created (real side effects)
	Changed       int            // updates and cancellations applied (real side effects)
	Replayed      int            // writes answered from a key that already took effect
	Mismatched    int            // writes refused: key reused with another request (422)
	Preconditions int            // writes refused on a stale If-Match (412)
	Abandoned     int            // writes the client hung up on before they were accepted
	Faults        int            // faults injected
	FaultsByKind  map[string]int // faults injected, by kind
	Duplicates    int            // see (*fakeAPI).Stats
	ResentAfter   int            // writes received for a key that had already taken effect
	Lookups       int
}

// SideEffects is Created + Changed.
func (s apiStats) SideEffects() int { return s.Created + s.Changed }

// fakeAPI is the fake order API.
type fakeAPI struct {
	t   testing.TB
	srv *httptest.Server

	mu        sync.Mutex
	orders    map[string]*fakeOrder // order id → order
	seq       int
	byKey     map[string]*keyEntry // Idempotency-Key → entry
	commits   map[string]int       // Idempotency-Key → side effects committed under it
	writesFor map[string]int       // Idempotency-Key → write requests received
	resent    map[string]int       // Idempotency-Key → writes received after it took effect
	faults    []*fault
	stats     apiStats
	holds     []*hold
	keysSeen  []string // Idempotency-Keys of writes, in arrival order (distinct)
	traces    []string // the traceparent header of every request that had one, in arrival order

	lookupDown bool // every lookup answers 503

	// random faults (crash loop)
	rnd      *rand.Rand
	rndP     float64
	rndKinds []faultKind
	rndLookP float64

	// connection control
	connMu   sync.Mutex
	addr     string
	refusing bool
	blackFD  int      // listening socket with a full accept queue, or -1
	filler   net.Conn // the connection filling it
}

// newFakeAPI starts the fake order API; it is closed when the test ends.
func newFakeAPI(t testing.TB) *fakeAPI {
	f := &fakeAPI{
		t: t, orders: map[string]*fakeOrder{}, byKey: map[string]*keyEntry{},
		commits: map[string]int{}, writesFor: map[string]int{}, resent: map[string]int{},
		blackFD: -1,
	}
	f.stats.FaultsByKind = map[string]int{}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serveHTTP))
	f.addr = f.srv.Listener.Addr().String()
	t.Cleanup(f.close)
	return f
}

// Traceparents are the traceparent headers the API received, in order.
func (f *fakeAPI) Traceparents() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.traces...)
}

// URL is the base URL to give idemgate (--orders-api).
func (f *fakeAPI) URL() string { return "http://" + f.addr }

func (f *fakeAPI) close() {
	f.mu.Lock()
	holds := slices.Clone(f.holds)
	f.mu.Unlock()
	for _, h := range holds {
		h.Release()
	}
	f.Accept() // a closed listener would make Close wait for nothing; restore it
	f.srv.CloseClientConnections()
	f.srv.Close()
}

// Inject queues faults; each is consumed by the next request it matches.
// Hold faults get their rendezvous, returned in order (nil for others).
func (f *fakeAPI) Inject(faults ...fault) []*hold {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*hold, len(faults))
	for i := range faults {
		ft := faults[i]
		if ft.Kind == HoldBeforeCommit || ft.Kind == HoldAfterCommit {
			ft.hold = newHold()
			f.holds = append(f.holds, ft.hold)
			out[i] = ft.hold
		}
		f.faults = append(f.faults, &ft)
	}
	return out
}

// InjectHold queues one Hold fault and returns its rendezvous.
func (f *fakeAPI) InjectHold(ft fault) *hold { return f.Inject(ft)[0] }

// PendingFaults is how many queued faults no request has consumed yet.
func (f *fakeAPI) PendingFaults() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.faults)
}

// SetLookupUnavailable makes every lookup by key answer 503 (the API
// cannot tell now) until switched off.
func (f *fakeAPI) SetLookupUnavailable(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if down && !f.lookupDown {
		f.countFault(Unavailable503)
	}
	f.lookupDown = down
}

// SetRandomFaults makes each create request suffer, with probability p, a
// fault drawn from kinds, and each lookup answer 503 with probability pl.
func (f *fakeAPI) SetRandomFaults(seed uint64, p float64, kinds []faultKind, pl float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rnd = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	f.rndP, f.rndKinds, f.rndLookP = p, kinds, pl
}

// BumpVersion changes an order behind idemgate's back (another system
// edits it): its version goes up by one. Not counted as a side effect of
// ours.
func (f *fakeAPI) BumpVersion(orderID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.orders[orderID]
	if o == nil {
		f.t.Fatalf("BumpVersion: no order %s at the fake API", orderID)
	}
	o.Version++
	o.Note = "edited elsewhere"
	o.UpdatedAt = time.Now().UTC()
	f.countFault("bump_version")
}

// Refuse closes the listening socket: connections are refused (ECONNREFUSED)
// until Accept.
func (f *fakeAPI) Refuse() {
	if f.closeListener() {
		f.mu.Lock()
		f.countFault("connection_refused")
		f.mu.Unlock()
	}
}

// closeListener closes the listening socket; false if it was closed.
func (f *fakeAPI) closeListener() bool {
	f.connMu.Lock()
	defer f.connMu.Unlock()
	if f.refusing {
		return false
	}
	f.srv.Listener.Close()
	f.refusing = true
	return true
}

// StopAccepting replaces the listening socket by one whose accept queue is
// full: a connection attempt is neither refused nor accepted and times out
// in the client's dialer (a timeout before the API accepted anything).
func (f *fakeAPI) StopAccepting() {
	f.closeListener()
	f.connMu.Lock()
	defer f.connMu.Unlock()
	host, portStr, _ := net.SplitHostPort(f.addr)
	port, _ := strconv.Atoi(portStr)
	ip := net.ParseIP(host).To4()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		f.t.Fatalf("StopAccepting: socket: %v", err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		f.t.Fatalf("StopAccepting: SO_REUSEADDR: %v", err)
	}
	sa := &syscall.SockaddrInet4{Port: port}
	copy(sa.Addr[:], ip)
	// The port can be busy for a moment after the listener closed (as in
	// Accept); keep trying for long enough on a loaded machine.
	for deadline := time.Now().Add(20 * time.Second); ; {
		err = syscall.Bind(fd, sa)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		syscall.Close(fd)
		f.t.Fatalf("StopAccepting: bind %s: %v", f.addr, err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // queue of one
		syscall.Close(fd)
		f.t.Fatalf("StopAccepting: listen: %v", err)
	}
	f.blackFD = fd
	c, err := net.DialTimeout("tcp", f.addr, time.Second) // fills the queue
	if err != nil {
		f.t.Fatalf("StopAccepting: filling the accept queue: %v", err)
	}
	f.filler = c
	f.mu.Lock()
	f.countFault("connection_not_accepted")
	f.mu.Unlock()
}

// Accept serves connections again on the same address.
func (f *fakeAPI) Accept() {
	f.connMu.Lock()
	defer f.connMu.Unlock()
	if f.filler != nil {
		f.filler.Close()
		f.filler = nil
	}
	if f.blackFD >= 0 {
		syscall.Close(f.blackFD)
		f.blackFD = -1
	}
	if !f.refusing {
		return
	}
	var ln net.Listener
	var err error
	// The port can stay busy for a while after the black-hole socket and
	// its queued connection are closed (their teardown is asynchronous in
	// the kernel); keep trying for long enough on a loaded machine.
	for deadline := time.Now().Add(20 * time.Second); ; {
		if ln, err = net.Listen("tcp", f.addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		f.t.Errorf("Accept: listen again on %s: %v", f.addr, err)
		return
	}
	f.srv.Listener = ln
	go f.srv.Config.Serve(ln)
	f.refusing = false
}

// Stats returns the counters. Duplicates counts what would have been a
// duplicate side effect: a second commit under one key, a write resent
// for a key that had already taken effect (at an API without a
// deduplication window — or past it — that resend is a second order),
// and the same request of one tenant committed under two different keys
// (the "retry minted a new key" bug).
func (f *fakeAPI) Stats() apiStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats
	s.FaultsByKind = map[string]int{}
	for k, v := range f.stats.FaultsByKind {
		s.FaultsByKind[k] = v
	}
	s.Duplicates = 0
	s.ResentAfter = 0
	for _, n := range f.commits {
		if n > 1 {
			s.Duplicates += n - 1
		}
	}
	for _, n := range f.resent {
		s.ResentAfter += n
	}
	s.Duplicates += s.ResentAfter
	intents := map[string]int{}
	for _, e := range f.byKey {
		intents[e.tenant+"\x00"+e.op+"\x00"+e.target+"\x00"+e.body]++
	}
	for _, n := range intents {
		if n > 1 {
			s.Duplicates += n - 1
		}
	}
	return s
}

// resolveKey maps k to the Idempotency-Key the fake saw: k itself, or
// the one key k + ":" + <incarnation> that idemgate sends for an operation
// (tests know the tenant and operation key, not the incarnation). The
// caller holds f.mu.
func (f *fakeAPI) resolveKey(k string) string {
	if _, ok := f.writesFor[k]; ok {
		return k
	}
	if _, ok := f.byKey[k]; ok {
		return k
	}
	for _, m := range []map[string]int{f.writesFor, f.commits} {
		for cand := range m {
			if strings.HasPrefix(cand, k+":") {
				return cand
			}
		}
	}
	for cand := range f.byKey {
		if strings.HasPrefix(cand, k+":") {
			return cand
		}
	}
	return k
}

// OrderForKey is the order the write with Idempotency-Key k (see
// resolveKey) created or changed, or nil.
func (f *fakeAPI) OrderForKey(k string) *fakeOrder {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.byKey[f.resolveKey(k)]
	if e == nil {
		return nil
	}
	o := *f.orders[e.orderID]
	return &o
}

// Order is the current state of an order, or nil.
func (f *fakeAPI) Order(id string) *fakeOrder {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.orders[id]
	if o == nil {
		return nil
	}
	c := *o
	return &c
}

// CommittedKeys is the Idempotency-Keys that took effect, sorted.
func (f *fakeAPI) CommittedKeys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.byKey))
	for k := range f.byKey {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// WritesFor is how many write requests arrived with Idempotency-Key k.
func (f *fakeAPI) WritesFor(k string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writesFor[f.resolveKey(k)]
}

// CommitsFor is how many side effects were committed under k.
func (f *fakeAPI) CommitsFor(k string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.commits[f.resolveKey(k)]
}

func (f *fakeAPI) countFault(kind faultKind) {
	f.stats.Faults++
	f.stats.FaultsByKind[string(kind)]++
}

// takeFault pops the first queued fault matching class and key (or draws
// a random one); f.mu is held.
func (f *fakeAPI) takeFault(class, key string) *fault {
	for i, ft := range f.faults {
		// A fault's Key is "<tenant>:<operation key>"; idemgate sends
		// that, or that and ":<incarnation>".
		if ft.Key != "" && ft.Key != key && !strings.HasPrefix(key, ft.Key+":") {
			continue
		}
		if ft.Match == class || (ft.Match == matchWrite && class != matchLookup) {
			f.faults = slices.Delete(f.faults, i, i+1)
			f.countFault(ft.Kind)
			return ft
		}
	}
	if f.rnd != nil {
		if class == matchCreate && f.rnd.Float64() < f.rndP {
			ft := &fault{Kind: f.rndKinds[f.rnd.IntN(len(f.rndKinds))], Match: class, Delay: 600 * time.Millisecond}
			f.countFault(ft.Kind)
			return ft
		}
		if class == matchLookup && f.rnd.Float64() < f.rndLookP {
			f.countFault(Unavailable503)
			return &fault{Kind: Unavailable503, Match: class}
		}
	}
	return nil
}

// ---------------------------------------------------------------------------
// HTTP

type apiError struct {
	status int
	msg    string
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func (f *fakeAPI) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.stats.Requests++
	if tp := r.Header.Get("Traceparent"); tp != "" {
		f.traces = append(f.traces, tp)
	}
	f.mu.Unlock()
	tenant := r.Header.Get("X-Idemgate-Tenant")
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case r.Method == http.MethodGet && path == "/orders":
		if k := r.URL.Query().Get("idempotency_key"); k != "" {
			f.lookup(w, tenant, k)
			return
		}
		f.list(w, tenant, r.URL.Query().Get("customer_id"), r.URL.Query().Get("limit"))
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/orders/"):
		id := strings.TrimPrefix(path, "/orders/")
		f.mu.Lock()
		o := f.orders[id]
		var b []byte
		if o != nil && o.tenant == tenant {
			b, _ = json.Marshal(o)
		}
		f.mu.Unlock()
		if b == nil {
			writeErr(w, http.StatusNotFound, "no such order")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	case r.Method == http.MethodPost && path == "/orders":
		f.write(w, r, matchCreate, "")
	case r.Method == http.MethodPatch && strings.HasPrefix(path, "/orders/"):
		f.write(w, r, matchUpdate, strings.TrimPrefix(path, "/orders/"))
	case r.Method == http.MethodPost && strings.HasPrefix(path, "/orders/") && strings.HasSuffix(path, "/cancel"):
		f.write(w, r, matchCancel, strings.TrimSuffix(strings.TrimPrefix(path, "/orders/"), "/cancel"))
	default:
		writeErr(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path)
	}
}

func (f *fakeAPI) lookup(w http.ResponseWriter, tenant, k string) {
	f.mu.Lock()
	f.stats.Lookups++
	ft := f.takeFault(matchLookup, k)
	down := f.lookupDown
	e := f.byKey[k]
	var answer []byte
	if e != nil && e.tenant == tenant {
		answer = e.answer
	}
	f.mu.Unlock()
	if down || (ft != nil && ft.Kind == Unavailable503) {
		writeErr(w, http.StatusServiceUnavailable, "lookup temporarily unavailable")
		return
	}
	if answer == nil {
		writeErr(w, http.StatusNotFound, "no request with this idempotency key took effect")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(answer)
}

func (f *fakeAPI) list(w http.ResponseWriter, tenant, customer, limitStr string) {
	limit, err := strconv.Atoi(limitStr)
	if err != nil || limit <= 0 {
		limit = 20
	}
	f.mu.Lock()
	var out []*fakeOrder
	for _, o := range f.orders {
		if o.tenant == tenant && o.CustomerID == customer {
			c := *o
			out = append(out, &c)
		}
	}
	f.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].seq > out[j].seq })
	if len(out) > limit {
		out = out[:limit]
	}
	if out == nil {
		out = []*fakeOrder{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"orders": out})
}

// canonical re-encodes a JSON body with sorted keys (encoding/json sorts
// map keys), so the same request compares equal however it was spelled.
func canonical(b []byte) (string, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", err
	}
	out, err := json.Marshal(v)
	return string(out), err
}

// write handles POST /orders, PATCH /orders/{id}, POST /orders/{id}/cancel.
func (f *fakeAPI) write(w http.ResponseWriter, r *http.Request, class, target string) {
	tenant := r.Header.Get("X-Idemgate-Tenant")
	key := r.Header.Get("Idempotency-Key")
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		writeErr(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	if key == "" {
		writeErr(w, http.StatusBadRequest, "Idempotency-Key is required")
		return
	}
	body, err := canonical(raw)
	if err != nil {
		writeErr(w, http.StatusBadRequest, "body is not JSON: "+err.Error())
		return
	}
	f.mu.Lock()
	f.stats.WriteRequests++
	if f.writesFor[key] == 0 {
		f.keysSeen = append(f.keysSeen, key)
	}
	f.writesFor[key]++
	ft := f.takeFault(class, key)
	f.mu.Unlock()

	// Faults before the commit.
	commitAnyway := ft != nil && ft.CommitAnyway
	if ft != nil {
		switch ft.Kind {
		case Fail500BeforeCommit:
			writeErr(w, http.StatusInternalServerError, "internal error before anything was done")
			return
		case Return409InProgress:
			writeErr(w, http.StatusConflict, "a request with this Idempotency-Key is in progress")
			if commitAnyway { // the in-flight twin finishes just after
				if fl, ok := w.(http.Flusher); ok {
					fl.Flush()
				}
				f.commit(tenant, key, class, target, body, raw, r.Header.Get("If-Match"))
			}
			return
		case DelayBeforeCommit:
			select {
			case <-time.After(ft.Delay):
			case <-r.Context().Done():
			}
			if r.Context().Err() != nil && !commitAnyway {
				f.abandon()
				return
			}
		case HoldBeforeCommit:
			ft.hold.arrive(r.Context())
			<-ft.hold.release
			if r.Context().Err() != nil && !commitAnyway {
				f.abandon()
				return
			}
		}
	}

	status, answer, aerr := f.commit(tenant, key, class, target, body, raw, r.Header.Get("If-Match"))
	if aerr != nil {
		writeErr(w, aerr.status, aerr.msg)
		return
	}

	// Faults after the commit.
	if ft != nil {
		switch ft.Kind {
		case Fail500AfterCommit:
			writeErr(w, http.StatusInternalServerError, "internal error after the order was stored")
			return
		case DropReplyAfterCommit:
			if c := hijack(w); c != nil {
				c.Close()
			}
			return
		case ResetMidResponse:
			if c := hijack(w); c != nil {
				fmt.Fprintf(c, "HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", status, len(answer))
				c.Write(answer[:len(answer)/2])
				if tc, ok := c.(*net.TCPConn); ok {
					tc.SetLinger(0) // RST, not FIN
				}
				c.Close()
			}
			return
		case DelayAfterCommit:
			select {
			case <-time.After(ft.Delay):
			case <-r.Context().Done():
			}
		case HoldAfterCommit:
			ft.hold.arrive(r.Context())
			<-ft.hold.release
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.WriteHeader(status)
	w.Write(answer)
}

func (f *fakeAPI) abandon() {
	f.mu.Lock()
	f.stats.Abandoned++
	f.mu.Unlock()
}

func hijack(w http.ResponseWriter) net.Conn {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return nil
	}
	c, buf, err := hj.Hijack()
	if err != nil {
		return nil
	}
	if buf != nil && buf.Writer != nil {
		buf.Writer.Flush()
	}
	return c
}

// commit applies one write atomically: the same key and request answers
// what it answered the first time (200); the same key with another request
// is 422; a stale If-Match is 412. It returns the status and body.
func (f *fakeAPI) commit(tenant, key, class, target, body string, raw []byte, ifMatch string) (int, []byte, *apiError) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := f.byKey[key]; e != nil {
		if e.op != class || e.target != target || e.body != body || e.tenant != tenant {
			f.stats.Mismatched++
			return 0, nil, &apiError{http.StatusUnprocessableEntity, "Idempotency-Key reused with a different request"}
		}
		f.stats.Replayed++
		f.resent[key]++
		return http.StatusOK, e.answer, nil
	}
	now := time.Now().UTC()
	var o *fakeOrder
	switch class {
	case matchCreate:
		var a struct {
			CustomerID            string          `json:"customer_id"`
			Items                 []fakeItem      `json:"items"`
			Currency              string          `json:"currency"`
			ShipTo                json.RawMessage `json:"ship_to"`
			RequestedDeliveryDate string          `json:"requested_delivery_date"`
			Note                  string          `json:"note"`
		}
		if err := json.Unmarshal(raw, &a); err != nil || a.CustomerID == "" || len(a.Items) == 0 || a.Currency == "" {
			return 0, nil, &apiError{http.StatusBadRequest, "customer_id, items and currency are required"}
		}
		f.seq++
		o = &fakeOrder{
			OrderID: fmt.Sprintf("ext_%06d", f.seq), Version: 1, Status: "placed",
			CustomerID: a.CustomerID, Items: a.Items, Currency: a.Currency, TotalMinor: itemsTotal(a.Items),
			ShipTo: a.ShipTo, RequestedDeliveryDate: a.RequestedDeliveryDate, Note: a.Note,
			OperationKey: key, CreatedAt: now, UpdatedAt: now, tenant: tenant, seq: f.seq,
		}
		f.orders[o.OrderID] = o
		f.stats.Created++
	case matchUpdate, matchCancel:
		cur := f.orders[target]
		if cur == nil || cur.tenant != tenant {
			return 0, nil, &apiError{http.StatusNotFound, "no such order"}
		}
		want, err := strconv.Atoi(strings.Trim(ifMatch, `"W/`))
		if err != nil {
			return 0, nil, &apiError{http.StatusPreconditionRequired, "If-Match is required"}
		}
		if want != cur.Version || cur.Status == "cancelled" {
			f.stats.Preconditions++
			return 0, nil, &apiError{http.StatusPreconditionFailed, fmt.Sprintf("order %s is at version %d, not %d", cur.OrderID, cur.Version, want)}
		}
		if class == matchUpdate {
			var ch struct {
				Items                 []fakeItem      `json:"items"`
				ShipTo                json.RawMessage `json:"ship_to"`
				RequestedDeliveryDate *string         `json:"requested_delivery_date"`
				Note                  *string         `json:"note"`
			}
			if err := json.Unmarshal(raw, &ch); err != nil {
				return 0, nil, &apiError{http.StatusBadRequest, "bad changes"}
			}
			if ch.Items != nil {
				cur.Items, cur.TotalMinor = ch.Items, itemsTotal(ch.Items)
			}
			if ch.ShipTo != nil {
				cur.ShipTo = ch.ShipTo
			}
			if ch.RequestedDeliveryDate != nil {
				cur.RequestedDeliveryDate = *ch.RequestedDeliveryDate
			}
			if ch.Note != nil {
				cur.Note = *ch.Note
			}
		} else {
			var c struct {
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(raw, &c)
			cur.Status, cur.CancelReason = "cancelled", c.Reason
		}
		cur.Version++
		cur.UpdatedAt = now
		o = cur
		f.stats.Changed++
	}
	answer, _ := json.Marshal(o)
	f.byKey[key] = &keyEntry{op: class, target: target, body: body, tenant: tenant, orderID: o.OrderID, answer: answer}
	f.commits[key]++
	return http.StatusOK, answer, nil
}

func itemsTotal(items []fakeItem) int64 {
	var t int64
	for _, it := range items {
		t += it.Quantity * it.UnitPriceMinor
	}
	return t
}

// ---------------------------------------------------------------------------
// The fake notification gateway (--notify-webhook)

// gwFault is a fault of the gateway.
type gwFault string

const (
	// gwDown answers 503 without storing.
	gwDown gwFault = "503_before_store"
	// gwStoreThen500 stores the message, then answers 500: the deliverer
	// must redeliver, and the redelivery must not store it twice.
	gwStoreThen500 gwFault = "store_then_500"
	// gwHoldAfterStore stores the message and blocks until released.
	gwHoldAfterStore gwFault = "hold_after_store"
)

// fakeGateway stores one message per Idempotency-Key and counts every
// delivery attempt.
type fakeGateway struct {
	srv *httptest.Server

	mu         sync.Mutex
	stored     map[string]json.RawMessage // Idempotency-Key → payload
	deliveries map[string]int             // Idempotency-Key → POSTs received
	storeCount map[string]int             // Idempotency-Key → times stored (must be ≤ 1)
	faults     []gwFault
	down       bool
	holds      []*hold
	nFaults    int
}

func newFakeGateway(t testing.TB) *fakeGateway {
	g := &fakeGateway{stored: map[string]json.RawMessage{}, deliveries: map[string]int{}, storeCount: map[string]int{}}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serveHTTP))
	t.Cleanup(func() {
		g.mu.Lock()
		hs := slices.Clone(g.holds)
		g.mu.Unlock()
		for _, h := range hs {
			h.Release()
		}
		g.srv.CloseClientConnections()
		g.srv.Close()
	})
	return g
}

func (g *fakeGateway) URL() string { return g.srv.URL + "/hooks/notify" }

// SetDown makes every delivery fail with 503 (nothing stored) until healed.
func (g *fakeGateway) SetDown(down bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if down && !g.down {
		g.nFaults++
	}
	g.down = down
}

// Inject queues gateway faults, consumed one per delivery.
func (g *fakeGateway) Inject(fs ...gwFault) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults = append(g.faults, fs...)
}

// InjectHold queues a gwHoldAfterStore and returns its rendezvous.
func (g *fakeGateway) InjectHold() *hold {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := newHold()
	g.holds = append(g.holds, h)
	g.faults = append(g.faults, gwHoldAfterStore)
	return h
}

func (g *fakeGateway) counts() (stored, deliveries, duplicates, faults int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.deliveries {
		deliveries += n
	}
	for _, n := range g.storeCount {
		stored++
		duplicates += n - 1
	}
	return stored, deliveries, duplicates, g.nFaults
}

func (g *fakeGateway) deliveriesOf(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.deliveries[id]
}

func (g *fakeGateway) storedIDs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for k := range g.stored {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (g *fakeGateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	raw, _ := io.ReadAll(r.Body)
	if r.Method != http.MethodPost || key == "" {
		writeErr(w, http.StatusBadRequest, "POST with Idempotency-Key expected")
		return
	}
	g.mu.Lock()
	g.deliveries[key]++
	var ft gwFault
	if g.down {
		ft = gwDown
	} else if len(g.faults) > 0 {
		ft = g.faults[0]
		g.faults = g.faults[1:]
		g.nFaults++
	}
	var h *hold
	if ft == gwHoldAfterStore {
		for _, c := range g.holds {
			select {
			case <-c.Arrived:
				continue
			default:
			}
			h = c
			break
		}
	}
	if ft == gwDown {
		g.mu.Unlock()
		writeErr(w, http.StatusServiceUnavailable, "gateway down")
		return
	}
	if _, ok := g.stored[key]; !ok {
		g.stored[key] = raw
		g.storeCount[key]++
	}
	g.mu.Unlock()
	switch ft {
	case gwStoreThen500:
		writeErr(w, http.StatusInternalServerError, "stored, but the answer failed")
		return
	case gwHoldAfterStore:
		if h != nil {
			h.arrive(r.Context())
			<-h.release
		}
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"status": "accepted"})
}

// ---------------------------------------------------------------------------
// Misc

// ctxSleep sleeps d or until ctx is done.
func ctxSleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// TestFaultFakeAPISelfCheck: the fake's accounting can fail — a write
// resent after it took effect and the same request under a second key are
// both counted as duplicates, a changed request under a key is refused
// (422), a stale If-Match is refused (412) — so "duplicates = 0" in the
// fault tests is a real observation.
func TestFaultFakeAPISelfCheck(t *testing.T) {
	api := newFakeAPI(t)
	post := func(method, path, key, ifMatch, body string) int {
		t.Helper()
		req, err := http.NewRequest(method, api.URL()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Idemgate-Tenant", "t")
		if ifMatch != "" {
			req.Header.Set("If-Match", ifMatch)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	body := `{"customer_id":"c","currency":"EUR","items":[{"sku":"s","quantity":1,"unit_price_minor":5}]}`
	if c := post("POST", "/orders", "t:k1", "", body); c != 200 {
		t.Fatalf("create: %d", c)
	}
	if st := api.Stats(); st.Created != 1 || st.Duplicates != 0 {
		t.Fatalf("after one create: %+v", st)
	}
	if c := post("POST", "/orders", "t:k1", "", ` {"items":[{"unit_price_minor":5,"quantity":1,"sku":"s"}],"currency":"EUR","customer_id":"c"}`); c != 200 {
		t.Fatalf("same key, same request respelled: %d", c)
	}
	if st := api.Stats(); st.Created != 1 || st.ResentAfter != 1 || st.Duplicates != 1 {
		t.Errorf("a resend after commit: %+v, want 1 created, 1 duplicate", st)
	}
	if c := post("POST", "/orders", "t:k1", "", strings.Replace(body, `"quantity":1`, `"quantity":2`, 1)); c != 422 {
		t.Errorf("same key, changed request: %d, want 422", c)
	}
	if c := post("POST", "/orders", "t:k2", "", body); c != 200 {
		t.Fatalf("second key: %d", c)
	}
	if st := api.Stats(); st.Created != 2 || st.Duplicates != 2 {
		t.Errorf("the same request under a second key: %+v, want 2 created, 2 duplicates", st)
	}
	id := api.OrderForKey("t:k1").OrderID
	if c := post("PATCH", "/orders/"+id, "t:k3", "2", `{"note":"x"}`); c != 412 {
		t.Errorf("stale If-Match: %d, want 412", c)
	}
	if c := post("PATCH", "/orders/"+id, "t:k3", "1", `{"note":"x"}`); c != 200 || api.Order(id).Version != 2 {
		t.Errorf("update at the current version: %d, %+v", c, api.Order(id))
	}
}
