// Package outbox is the notification outbox: messages are written in the
// transaction of the operation that sends them (Enqueue, inside a
// ledger.Tx), and delivered afterwards by a Deliverer to a Sink — a
// directory of files (DirSink), lines appended to segment files
// (SegmentSink), or a webhook gateway (WebhookSink). Each
// message has a stable id derived from its operation and step, which is
// what makes redelivery harmless at an idempotent sink.
package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
)

// The outbox's collections in the ledger. A message's id is derived from
// its operation (key and incarnation, see MessageID) and step, which keeps
// two operations under one reused key apart.
const (
	// Collection holds the messages: message_id → Message (JSON).
	Collection  = "outbox"
	collPending = "outbox_pending" // message_id → "" while not delivered
	collByOp    = "outbox_by_op"   // tenant \x00 key \x00 step → message_id (of the key's latest operation)
)

// Message is one outbound notification.
type Message struct {
	MessageID    string `json:"message_id"`
	Tenant       string `json:"tenant"`
	OperationKey string `json:"operation_key"`
	// Incarnation is the operation's Record.Incarnation ("" for messages
	// of records written before incarnations existed).
	Incarnation string    `json:"incarnation,omitempty"`
	Step        string    `json:"step"`
	Channel     string    `json:"channel"`
	To          []string  `json:"to,omitempty"`
	Subject     string    `json:"subject,omitempty"`
	Body        string    `json:"body,omitempty"`
	OrderID     string    `json:"order_id,omitempty"`
	State       string    `json:"state"` // queued, delivered, dead
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"last_error,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	DeliveredAt time.Time `json:"delivered_at,omitzero"`
	// NextAttemptAt is when a queued message whose delivery failed may be
	// tried again (zero: now).
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	// BudgetFrom is Attempts when the current retry budget started: 0, or
	// the attempts made before the last Requeue.
	BudgetFrom int `json:"budget_from,omitempty"`
	// PayloadSHA256 is set, and To, Subject and Body are empty, in a
	// delivered message read from the outbox: once delivered, a message is
	// never handed to a sink again, so the outbox keeps only the SHA-256
	// of what was handed over (base64url, unpadded; see payloadDigest),
	// against which a message enqueued again under the same id is
	// compared. Queued and dead-lettered messages keep their payload.
	PayloadSHA256 string `json:"payload_sha256,omitempty"`
}

// Message states.
const (
	MessageQueued    = "queued"    // waiting for (another) delivery attempt
	MessageDelivered = "delivered" // the sink accepted it
	MessageDead      = "dead"      // dead-lettered: refused, or out of retry budget; see Requeue
)

// Errors of Requeue.
var (
	ErrMessageNotFound = errors.New("outbox: no such message")
	ErrMessageNotDead  = errors.New("outbox: message is not dead-lettered")
)

// MessageID is the stable identity of one side effect (step) of an
// operation, named by ref: "<key>:<incarnation>", or the key alone for an
// operation recorded before incarnations existed (see OpRef).
func MessageID(tenant, ref, step string) string {
	sum := sha256.Sum256([]byte("message\x00" + tenant + "\x00" + ref + "\x00" + step))
	return "msg_" + hex.EncodeToString(sum[:16])
}

// OpRef names an operation to its downstreams, from its key and its
// ledger record's incarnation: "<key>:<incarnation>", unique per
// operation rather than per key (a key is free again once its tombstone is
// deleted). A record written before incarnations existed has none; its
// name is the key alone, as it was then, so its replays, re-runs and
// reconciliations name what they named.
func OpRef(key, incarnation string) string {
	if incarnation == "" {
		return key
	}
	return key + ":" + incarnation
}

// errMessageExists: a message with the id an enqueue derived already
// exists with other content. Ids are unique per operation and step, so
// this is a fault: the enqueue (and the transaction it is part of) fails
// rather than overwrite a message that may already have been delivered.
var errMessageExists = errors.New("outbox: a different message with this id already exists; refusing to overwrite it")

// Enqueue writes m into the outbox inside the caller's transaction, with
// its id (MessageID of its operation and step), state queued and the
// transaction's time set on m. A message already queued under m's id with
// the same content is left as it is (its delivery state stands, and m is
// set to it); one with other content is an error and nothing is written.
// The message is delivered only if the transaction commits.
func Enqueue(tx ledger.Tx, m *Message) error { return enqueue(tx, m, false) }

// EnqueueFresh is Enqueue for a message of an operation created in tx
// (ledger.Record.Fresh): no message can have its id yet, so it is written
// without first reading whether one does, which on PostgreSQL saves a
// round trip.
func EnqueueFresh(tx ledger.Tx, m *Message) error { return enqueue(tx, m, true) }

func enqueue(tx ledger.Tx, m *Message, fresh bool) error {
	m.MessageID = MessageID(m.Tenant, OpRef(m.OperationKey, m.Incarnation), m.Step)
	m.State = MessageQueued
	m.CreatedAt = tx.Now()
	var cur *Message
	if !fresh {
		var err error
		if cur, err = getMessage(tx, m.MessageID); err != nil {
			return err
		}
	}
	if cur != nil {
		if !cur.holds(payloadOf(m)) || cur.Incarnation != m.Incarnation {
			return fmt.Errorf("%w: %s", errMessageExists, m.MessageID)
		}
		if cur.PayloadSHA256 != "" { // delivered: the payload is m's
			cur.To, cur.Subject, cur.Body, cur.PayloadSHA256 = m.To, m.Subject, m.Body, ""
		}
		*m = *cur
		return nil
	}
	if err := putMessage(tx, m); err != nil {
		return err
	}
	if err := tx.Put(collPending, m.MessageID, nil); err != nil {
		return err
	}
	return tx.Put(collByOp, m.Tenant+"\x00"+m.OperationKey+"\x00"+m.Step, []byte(m.MessageID))
}

// Get returns the message with the id, or nil when there is none.
func Get(tx ledger.Tx, id string) (*Message, error) { return getMessage(tx, id) }

func getMessage(tx ledger.Tx, id string) (*Message, error) {
	v, err := tx.Get(Collection, id)
	if err != nil || v == nil {
		return nil, err
	}
	var m Message
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, fmt.Errorf("outbox message %s: %w", id, err)
	}
	return &m, nil
}

// OfOperation returns the messages of an operation (its key and
// incarnation), by step. Messages of an earlier operation under the same
// key are not its own and are left out.
func OfOperation(tx ledger.Tx, tenant, key, incarnation string) ([]*Message, error) {
	var out []*Message
	err := tx.Scan(collByOp, tenant+"\x00"+key+"\x00", false, func(_ string, id []byte) (bool, error) {
		m, err := getMessage(tx, string(id))
		if err == nil && m != nil && m.Incarnation == incarnation {
			out = append(out, m)
		}
		return true, err
	})
	return out, err
}

// DeadLetterList is what DeadLetters found.
type DeadLetterList struct {
	// Messages are the tenant's dead letters found, in message id order.
	Messages []*Message
	// Scanned is how many messages (of every tenant) were read.
	Scanned int
	// Truncated: the read stopped at its bound with messages left unread,
	// among which there may be more of the tenant's dead letters.
	Truncated bool
	// Undecodable are the ids of the messages read that are not valid
	// JSON: they were skipped, for the caller to log.
	Undecodable []string
}

// DeadLetters returns up to limit of tenant's dead-lettered messages (see
// Requeue), in message id order, reading at most scan messages of the
// outbox. There is no index of dead letters: it reads the messages of every
// tenant until it has limit of them or has read scan, so its cost is
// bounded by scan, not by the outbox; Truncated says when it stopped at
// scan with messages left. A message that is not valid JSON is skipped
// and named in Undecodable, so that one damaged message of any tenant
// does not hide every tenant's dead letters. Errors: the transaction's.
//
// Why not an index kept where a message becomes dead and where it is
// requeued: every process writing the outbox would have to keep it —
// older builds sharing the ledger during an upgrade would not, and their
// dead letters would not be listed — and ledgers that already hold dead
// letters would need it built first; the bounded scan needs neither and
// adds nothing to the delivery path.
func DeadLetters(tx ledger.Tx, tenant string, limit, scan int) (*DeadLetterList, error) {
	out := &DeadLetterList{}
	if limit <= 0 || scan <= 0 {
		return out, nil
	}
	err := tx.Scan(Collection, "", false, func(id string, v []byte) (bool, error) {
		if out.Scanned == scan {
			out.Truncated = true // one more message than scan: some are left
			return false, nil
		}
		out.Scanned++
		var m Message
		if err := json.Unmarshal(v, &m); err != nil {
			out.Undecodable = append(out.Undecodable, id)
			return true, nil
		}
		if m.Tenant == tenant && m.State == MessageDead {
			out.Messages = append(out.Messages, &m)
		}
		return len(out.Messages) < limit, nil
	})
	return out, err
}

// deliveryPayload is what every sink hands over for a message: the file
// the directory sink writes, the body the webhook sink POSTs.
type deliveryPayload struct {
	MessageID    string   `json:"message_id"`
	Channel      string   `json:"channel"`
	To           []string `json:"to"`
	Subject      string   `json:"subject"`
	Body         string   `json:"body"`
	OrderID      string   `json:"order_id"`
	OperationKey string   `json:"operation_key"`
	Step         string   `json:"step"`
}

// samePayload reports whether two payloads hand over the same message.
func samePayload(a, b deliveryPayload) bool {
	return a.MessageID == b.MessageID && a.Channel == b.Channel && slices.Equal(a.To, b.To) &&
		a.Subject == b.Subject && a.Body == b.Body && a.OrderID == b.OrderID &&
		a.OperationKey == b.OperationKey && a.Step == b.Step
}

func payloadOf(m *Message) deliveryPayload {
	return deliveryPayload{
		MessageID: m.MessageID, Channel: m.Channel, To: m.To, Subject: m.Subject,
		Body: m.Body, OrderID: m.OrderID, OperationKey: m.OperationKey, Step: m.Step,
	}
}

// Sink hands a message to the outside world. Deliver must be idempotent
// per MessageID: the deliverer may call it more than once for a message
// (after a crash, or from two processes at once). Flush makes everything
// Deliver reported as done durable; the deliverer calls it before it
// records any message as delivered.
type Sink interface {
	Deliver(ctx context.Context, m *Message) error
	Flush() error
}

// DirSink writes each message as <dir>/<message_id>.json. A message id's
// file is created at most once and only whole: its bytes are written to a
// file with no name (O_TMPFILE on Linux; elsewhere, or where the file
// system lacks it, a temporary file) which is then linked under the final
// name, and linking fails if the name exists. So redelivery cannot
// duplicate or change a message. A delivery finds an existing file done
// only when it holds this very message; a file that holds a different
// message under the id is never overwritten, and the delivery fails
// permanently (the message is dead-lettered, for an operator to look at)
// instead of being recorded as delivered.
//
// Deliver does not sync. Flush makes every file delivered since the last
// Flush durable, with the directory entries naming them, before the
// deliverer records any of them as delivered: on Linux 5.8+ with one syncfs(2)
// of the file system holding the directory — one sync per pass, whatever
// its size, though it also writes back whatever else is dirty on that file
// system — and elsewhere by starting every file's write-back, then
// fsyncing each file and the directory (syncs that find their data
// mostly written already). BENCHMARKS.md compares the two with an fsync
// per message.
type DirSink struct {
	dir     string
	mu      sync.Mutex
	written []string // files to fsync at the next Flush
	// noTmpfile is set once O_TMPFILE failed here; from then on the
	// portable temporary file is used.
	noTmpfile atomic.Bool
	// syncMode is how Flush syncs (syncFS, syncEach, syncStaged).
	syncMode atomic.Int32
	// syncs counts the syncs Flush issued (benchmarks).
	syncs atomic.Int64
}

// NewDirSink creates dir if needed.
func NewDirSink(dir string) (*DirSink, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("outbox directory: %w", err)
	}
	return &DirSink{dir: dir}, nil
}

// Deliver implements Sink.
func (d *DirSink) Deliver(_ context.Context, m *Message) error {
	final := filepath.Join(d.dir, m.MessageID+".json")
	if _, err := os.Stat(final); err == nil {
		switch d.holds(final, m) {
		case fileSame:
			d.remember(final) // may be a file of a delivery that crashed before its flush
			return nil
		case fileDifferent:
			return &PermanentError{Err: fmt.Errorf("%s already holds a different message under this id; it was not overwritten and this message was not delivered", filepath.Base(final))}
		}
		// A crash (power loss before the flush) left it empty or cut
		// short: write it again, replacing it whole.
		if err := os.Remove(final); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	b, err := json.MarshalIndent(payloadOf(m), "", "  ")
	if err != nil {
		return err
	}
	if err := d.create(final, append(b, '\n')); err != nil {
		if !errors.Is(err, os.ErrExist) {
			return err
		}
		// Another process delivered it meanwhile: done only if it is this
		// message.
		if d.holds(final, m) != fileSame {
			return &PermanentError{Err: fmt.Errorf("%s already holds a different or damaged message under this id; it was not overwritten and this message was not delivered", filepath.Base(final))}
		}
	}
	d.remember(final)
	return nil
}

// create makes the file final holding data, whole or not at all; an
// error wrapping os.ErrExist when the name exists.
func (d *DirSink) create(final string, data []byte) error {
	if !d.noTmpfile.Load() {
		err := createUnnamed(d.dir, final, data)
		if !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
		d.noTmpfile.Store(true)
	}
	return createViaTemp(d.dir, final, data)
}

// createViaTemp is create with a named temporary file, hard-linked under
// the final name and removed.
func createViaTemp(dir, final string, data []byte) error {
	tmp, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(final)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Link(tmp.Name(), final)
}

// What a message file holds, compared with the message being delivered.
const (
	fileBroken    = iota // unreadable, empty or cut short (a crash before the flush)
	fileSame             // this very message
	fileDifferent        // a whole message file with other content
)

// holds compares the file at path with m's payload.
func (d *DirSink) holds(path string, m *Message) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return fileBroken
	}
	var got deliveryPayload
	if json.Unmarshal(b, &got) != nil || got.MessageID == "" {
		return fileBroken
	}
	if samePayload(got, payloadOf(m)) {
		return fileSame
	}
	return fileDifferent
}

func (d *DirSink) remember(path string) {
	d.mu.Lock()
	d.written = append(d.written, path)
	d.mu.Unlock()
}

// How Flush makes a pass durable.
const (
	syncFS     = iota // one syncfs(2) of the file system holding the directory
	syncEach          // fsync each file, then the directory
	syncStaged        // start write-back of every file, then fsync each and the directory
)

// Flush implements Sink: it makes the files delivered since the last
// Flush, and the directory entries naming them, durable.
func (d *DirSink) Flush() error {
	d.mu.Lock()
	files := d.written
	d.written = nil
	d.mu.Unlock()
	if len(files) == 0 {
		return nil
	}
	if err := d.flush(files); err != nil {
		d.mu.Lock()
		d.written = append(d.written, files...) // try again next time
		d.mu.Unlock()
		return err
	}
	return nil
}

func (d *DirSink) flush(files []string) error {
	mode := d.syncMode.Load()
	if mode == syncFS {
		d.syncs.Add(1)
		err := syncFileSystem(d.dir)
		if !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
		d.syncMode.Store(syncStaged)
		mode = syncStaged
	}
	names := append(files, d.dir)
	if mode == syncStaged {
		// Start every file's write-back first, so the fsyncs below find
		// the pass's data on its way to disk together.
		for _, name := range files {
			if f, err := os.Open(name); err == nil {
				startWriteback(f)
				f.Close()
			}
		}
	}
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		d.syncs.Add(1)
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// Deliverer moves queued messages from the outbox to a sink. A failed
// delivery is retried after a backoff with full jitter — a delay drawn
// uniformly from [0, min(RetryCap, RetryBase·2^(n-1))) after the n-th
// failure — until RetryBudget attempts have failed; a message whose
// delivery fails with a *PermanentError, or that runs out of budget, is
// dead-lettered (state dead) and waits for Requeue.
type Deliverer struct {
	store ledger.Store
	sink  Sink
	log   *slog.Logger
	kick  chan struct{}
	// Interval is how often the outbox is scanned without a kick (messages
	// left by a process that stopped before delivering them).
	Interval time.Duration
	// Gather is how long a kicked pass waits for more messages to join it
	// (0: no waiting, a pass per kick). While fewer than gatherFill
	// messages were queued since the last pass began (they trickle in),
	// it waits on, up to GatherMax after the kick, so that one pass — one
	// sink sync, one claim — serves many of them: a message queued while
	// the deliverer is idle is handed to the sink within GatherMax (plus
	// the pass itself, and at most carryWait for its claim to commit).
	Gather    time.Duration
	GatherMax time.Duration // default DefaultGatherMax; below Gather: Gather
	// kicks counts Kick calls (about one per message queued).
	kicks atomic.Int64
	// RetryBase is the backoff ceiling after the first failure; it doubles
	// with each further failure up to RetryCap.
	RetryBase time.Duration // default 1s
	RetryCap  time.Duration // default 5 min
	// RetryBudget is how many failed attempts a message gets before it is
	// dead-lettered.
	RetryBudget int // default DefaultRetryBudget (12)
	// Rand returns a number in [0, 1) for the jitter; tests fix it.
	Rand func() float64 // default math/rand/v2 Float64
	// ClaimLease is how long this deliverer's claim of a message keeps
	// other deliverers off it (see claim.go).
	ClaimLease time.Duration // default DefaultClaimLease
	// owner names this deliverer in its claims.
	owner string

	// recording holds the messages whose outcome Run delivered and queued
	// for the ledger's next write (laterStore) but that is not committed
	// yet: a pass skips them meanwhile.
	recMu     sync.Mutex
	recording map[string]bool
}

// laterStore is a store that can carry a write in its next transaction
// (ledger.Ledger.Later): Run records a pass's outcome with it, so a pass
// while calls are committing costs no commit of its own.
type laterStore interface {
	Later(fn func(ledger.Tx) error, done func(error))
}

// Gathering defaults of a Deliverer (see Deliverer.Gather).
const (
	DefaultGather    = 20 * time.Millisecond
	DefaultGatherMax = 100 * time.Millisecond
	// gatherFill is how many messages queued since the last pass make a
	// pass worth starting at Gather rather than waiting on for more.
	gatherFill = 64
)

// Retry defaults of a Deliverer.
const (
	DefaultRetryBase   = time.Second
	DefaultRetryCap    = 5 * time.Minute
	DefaultRetryBudget = 12
)

// NewDeliverer returns a deliverer; start it with Run.
func NewDeliverer(store ledger.Store, sink Sink, log *slog.Logger) *Deliverer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Deliverer{
		store: store, sink: sink, log: log, kick: make(chan struct{}, 1), Interval: time.Second,
		Gather: DefaultGather, GatherMax: DefaultGatherMax,
		RetryBase: DefaultRetryBase, RetryCap: DefaultRetryCap, RetryBudget: DefaultRetryBudget, Rand: rand.Float64,
		ClaimLease: DefaultClaimLease, owner: uuid.NewString(),
	}
}

// backoff is the delay before the next attempt of a message whose
// delivery has failed n times in its current budget (n >= 1): full
// jitter, uniform in [0, min(cap, base·2^(n-1))).
func (d *Deliverer) backoff(n int) time.Duration {
	base, limit, rnd := d.RetryBase, d.RetryCap, d.Rand
	if base <= 0 {
		base = DefaultRetryBase
	}
	if limit <= 0 {
		limit = DefaultRetryCap
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	ceiling := min(base, limit)
	for i := 1; i < n && ceiling < limit; i++ {
		ceiling = min(2*ceiling, limit)
	}
	r := rnd()
	if r < 0 || r >= 1 || r != r {
		r = 0
	}
	return time.Duration(r * float64(ceiling))
}

func (d *Deliverer) budget() int {
	if d.RetryBudget <= 0 {
		return DefaultRetryBudget
	}
	return d.RetryBudget
}

// putMessage stores m; a delivered one without its payload (see
// Message.PayloadSHA256). m is not changed.
func putMessage(tx ledger.Tx, m *Message) error {
	if m.State == MessageDelivered && m.PayloadSHA256 == "" {
		stored := *m
		stored.PayloadSHA256 = payloadDigest(payloadOf(m))
		stored.To, stored.Subject, stored.Body = nil, "", ""
		m = &stored
	}
	v, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return tx.Put(Collection, m.MessageID, v)
}

// payloadDigest is the SHA-256 of a payload's JSON, base64url unpadded.
func payloadDigest(p deliveryPayload) string {
	if len(p.To) == 0 {
		p.To = nil // as samePayload, no recipients however written
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic("outbox: payload JSON: " + err.Error()) // strings only: it cannot fail
	}
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// holds reports whether m, as read from the outbox, hands over p: by its
// payload, or by its digest once delivered.
func (m *Message) holds(p deliveryPayload) bool {
	if m.PayloadSHA256 != "" {
		return m.PayloadSHA256 == payloadDigest(p)
	}
	return samePayload(payloadOf(m), p)
}

// Requeue puts a dead-lettered message back in the queue for delivery as
// soon as possible, with a fresh retry budget; its attempts so far are
// kept. It is for an operator who fixed what made the deliveries fail.
// The requeue is written to the audit log in the same transaction (event
// operator, decision requeued): by (its Principal, Role, ClientName), the
// message's tenant and operation key, and the message id; the entry and
// the requeue commit together or not at all.
// Errors: ErrMessageNotFound, ErrMessageNotDead, ledger errors.
func (d *Deliverer) Requeue(ctx context.Context, messageID string, by ledger.Actor) error {
	err := d.store.Update(ctx, func(tx ledger.Tx) error {
		cur, err := getMessage(tx, messageID)
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("%w: %q", ErrMessageNotFound, messageID)
		}
		if cur.State != MessageDead {
			return fmt.Errorf("%w: %s is %s", ErrMessageNotDead, messageID, cur.State)
		}
		attempts, lastErr := cur.Attempts, cur.LastError
		cur.State, cur.NextAttemptAt, cur.BudgetFrom = MessageQueued, time.Time{}, cur.Attempts
		if err := putMessage(tx, cur); err != nil {
			return err
		}
		if err := tx.Put(collPending, messageID, nil); err != nil {
			return err
		}
		a := by
		a.Tenant = cur.Tenant // the message's tenant sees it in its log, whoever requeued it
		detail := fmt.Sprintf("message %s (%s, step %s) requeued after %d attempts", cur.MessageID, cur.Channel, cur.Step, attempts)
		if lastErr != "" {
			detail += "; last error: " + lastErr
		}
		if len(detail) > 500 {
			detail = strings.ToValidUTF8(detail[:500], "") + "…" // no rune cut in half
		}
		return ledger.AppendAudit(tx, ledger.AuditEntry{
			Event: ledger.EventOperator, Actor: a, Key: cur.OperationKey,
			Decision: ledger.AuditRequeued, Detail: detail,
			Call: &ledger.DownstreamCall{System: "outbox", MessageIDs: []string{cur.MessageID}},
		})
	})
	if err == nil {
		d.Kick()
	}
	return err
}

// Kick asks for a delivery pass soon; it never blocks.
func (d *Deliverer) Kick() {
	d.kicks.Add(1)
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run delivers until ctx is done; it returns then. A pass that was full
// (it took as many due messages as a pass takes) and delivered some is
// followed at once by the next; otherwise the next waits for a Kick (and
// Gather) or Interval.
//
// Each pass's outcome is recorded with the ledger's next write (see
// laterStore) — the commit of a call, or the ledger's flush within a
// fraction of a second — rather than by a commit of its own: the sink has
// made the pass durable already, and a message delivered again after a
// crash in between is one the sink already holds (Sink.Deliver is
// idempotent per message id).
func (d *Deliverer) Run(ctx context.Context) {
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	for {
		since := d.kicks.Load()
		n, full, err := d.deliverPass(ctx, true)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("outbox delivery", "err", err)
		}
		if full && n > 0 && ctx.Err() == nil {
			// The pass took as many messages as one pass takes and
			// delivered some: more are likely due, so the next pass starts
			// at once. (A full pass that delivered none — a sink that
			// refuses everything — waits as usual, not to spin.)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
			// Let a burst of operations queue up, so one pass (one
			// claim, one sink sync, one record) delivers them all.
			if !d.gather(ctx, since) {
				return
			}
		case <-t.C:
		}
	}
}

// gather is the wait of a kicked pass (see Deliverer.Gather): Gather,
// then on while fewer than gatherFill kicks came since since, up to
// GatherMax after it began. It reports false when ctx is done.
func (d *Deliverer) gather(ctx context.Context, since int64) bool {
	if d.Gather <= 0 {
		return ctx.Err() == nil
	}
	begun := time.Now()
	t := time.NewTimer(d.Gather)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	for d.kicks.Load()-since < gatherFill {
		left := d.GatherMax - time.Since(begun)
		if left <= 0 {
			break
		}
		t.Reset(left)
		select {
		case <-ctx.Done():
			return false
		case <-d.kick: // one more message: count again
		case <-t.C:
			return true
		}
	}
	return true
}

// DeliverPending tries every queued message that is due (its
// NextAttemptAt, by the ledger's clock, is not in the future) once, with
// no transaction open during delivery; then flushes the sink and records
// every outcome in one transaction. It returns how many were delivered,
// and the delivery errors of this pass, joined.
func (d *Deliverer) DeliverPending(ctx context.Context) (int, error) {
	n, _, err := d.deliverPass(ctx, false)
	return n, err
}

// passLimit is how many due messages one delivery pass takes; a pass
// reads the queue passChunk messages at a time.
const (
	passLimit = 500
	passChunk = 64
)

// deliverPass is DeliverPending, also reporting whether the pass was full
// (it took passLimit messages, so more may be due). With later, and a
// store that can (laterStore), the outcome is recorded with the ledger's
// next write, and n counts the deliveries the sink accepted.
func (d *Deliverer) deliverPass(ctx context.Context, later bool) (int, bool, error) {
	var pending []*Message
	var stale []string // pending entries of messages that are not queued
	d.recMu.Lock()
	recording := maps.Clone(d.recording)
	d.recMu.Unlock()
	err := d.store.View(ctx, func(tx ledger.Tx) error {
		pending, stale = nil, nil
		now := tx.Now()
		// The live claims first, in one walk: a message another deliverer
		// holds is passed over without reading it (on a database, every
		// read is a round trip, and with several replicas most of the
		// queue may be theirs).
		others := map[string]bool{}
		if err := tx.Scan(collClaims, "", false, func(id string, v []byte) (bool, error) {
			if d.othersClaim(v, now) {
				others[id] = true
			}
			return true, nil
		}); err != nil {
			return err
		}
		// The messages are read a chunk at a time, each chunk's reads
		// together (ledger.Prefetch: on a database, one round trip).
		var chunk []string
		readChunk := func() error {
			ledger.Prefetch(tx, Collection, chunk...)
			for _, id := range chunk {
				m, err := getMessage(tx, id)
				switch {
				case err != nil:
					return err
				case m == nil || m.State != MessageQueued:
					stale = append(stale, id)
				case m.NextAttemptAt.After(now):
					// Backing off: a later pass takes it.
				case len(pending) < passLimit:
					pending = append(pending, m)
				}
			}
			chunk = chunk[:0]
			return nil
		}
		err := tx.Scan(collPending, "", false, func(id string, _ []byte) (bool, error) {
			if recording[id] || others[id] {
				return true, nil // delivered (its record is on its way), or another deliverer has it
			}
			chunk = append(chunk, id)
			if len(chunk) < min(passChunk, passLimit-len(pending)) {
				return true, nil
			}
			if err := readChunk(); err != nil {
				return false, err
			}
			return len(pending) < passLimit, nil
		})
		if err != nil || len(chunk) == 0 {
			return err
		}
		return readChunk()
	})
	if err != nil {
		return 0, false, err
	}
	if len(pending) == 0 && len(stale) == 0 {
		return 0, false, nil
	}
	full := len(pending) >= passLimit
	// Claim what this pass delivers, so no other deliverer sends it at the
	// same time (claim.go).
	claimedAt := time.Now()
	ls, carried := d.store.(laterStore)
	carried = carried && later
	if len(pending) > 0 {
		if carried {
			pending, claimedAt, err = d.claimCarried(ctx, ls, pending)
		} else {
			pending, claimedAt, err = d.claim(ctx, pending)
		}
		if err != nil {
			return 0, false, err
		}
	}
	startBy := claimedAt.Add(d.claimLease() / 2)
	if len(pending) == 0 && len(stale) == 0 {
		return 0, false, nil // every one is another deliverer's
	}
	// Deliver everything first (no transaction open), then record every
	// outcome in one transaction: one commit per pass, not per message.
	attempted := make([]bool, len(pending))
	derrs := make([]error, len(pending))
	for i, m := range pending {
		if ctx.Err() != nil || time.Now().After(startBy) {
			// Shutting down, or too little of the claim is left to start
			// another delivery: what is left waits for the next pass.
			break
		}
		derrs[i] = d.sink.Deliver(ctx, m)
		// A failure caused by our own cancellation is not the sink's: it
		// does not spend an attempt.
		attempted[i] = derrs[i] == nil || ctx.Err() == nil
	}
	if err := d.sink.Flush(); err != nil {
		return 0, false, fmt.Errorf("outbox sink flush: %w", err) // nothing recorded: the next pass redelivers
	}
	budget := d.budget()
	n := 0
	var dead []*Message
	record := func(tx ledger.Tx) error {
		n, dead = 0, nil
		now := tx.Now()
		// Until the claims may have expired (by this process's clock, a
		// margin before) no other deliverer can hold them.
		mine := time.Now().Before(claimedAt.Add(d.claimLease() * 9 / 10))
		if len(pending) > 0 {
			// The claims before the messages, as a claim takes them: on a
			// backend that locks what a transaction reads (PostgreSQL),
			// a record that held a message while it waited for the claims
			// would deadlock with another deliverer's claim holding the
			// claims while it waits for that message.
			if _, err := tx.Get(collClaims, pending[0].MessageID); err != nil {
				return err
			}
		}
		ids := slices.Clone(stale)
		for i, m := range pending {
			if attempted[i] {
				ids = append(ids, m.MessageID)
			}
		}
		ledger.Prefetch(tx, Collection, ids...)
		for _, id := range stale {
			cur, err := getMessage(tx, id)
			if err != nil {
				return err
			}
			if cur == nil || cur.State != MessageQueued {
				if err := tx.Delete(collPending, id); err != nil {
					return err
				}
			}
		}
		for i, m := range pending {
			if err := d.release(tx, m.MessageID, mine); err != nil {
				return err
			}
			if !attempted[i] {
				continue
			}
			cur, err := getMessage(tx, m.MessageID)
			if err != nil {
				return err
			}
			if cur == nil || cur.State != MessageQueued {
				continue // delivered or dead-lettered by another pass meanwhile
			}
			if derrs[i] == nil {
				cur.Attempts++
				cur.State, cur.LastError, cur.DeliveredAt, cur.NextAttemptAt = MessageDelivered, "", now, time.Time{}
				if err := tx.Delete(collPending, cur.MessageID); err != nil {
					return err
				}
				n++
			} else {
				if cur.Attempts != m.Attempts {
					// Another pass (another process) recorded an attempt
					// since we read the message: its backoff stands, and
					// one failure is not counted twice.
					continue
				}
				cur.Attempts++
				cur.LastError = derrs[i].Error()
				switch used := cur.Attempts - cur.BudgetFrom; {
				case IsPermanent(derrs[i]):
					cur.State, cur.NextAttemptAt = MessageDead, time.Time{}
				case used >= budget:
					cur.State, cur.NextAttemptAt = MessageDead, time.Time{}
					cur.LastError = fmt.Sprintf("gave up after %d failed attempts: %s", used, cur.LastError)
				default:
					cur.NextAttemptAt = now.Add(d.backoff(used))
				}
				if cur.State == MessageDead {
					if err := tx.Delete(collPending, cur.MessageID); err != nil {
						return err
					}
					dead = append(dead, cur)
				}
			}
			if err := putMessage(tx, cur); err != nil {
				return err
			}
		}
		return nil
	}
	recorded := func(err error) {
		if err != nil {
			n = 0
			return
		}
		for _, m := range dead {
			d.log.Warn("outbox message dead-lettered", "message_id", m.MessageID, "attempts", m.Attempts, "err", m.LastError)
		}
	}
	if carried {
		ids := make([]string, 0, len(pending)+len(stale))
		accepted := 0
		for i, m := range pending {
			if attempted[i] {
				ids = append(ids, m.MessageID)
				if derrs[i] == nil {
					accepted++
				}
			}
		}
		d.recMu.Lock()
		if d.recording == nil {
			d.recording = map[string]bool{}
		}
		for _, id := range ids {
			d.recording[id] = true
		}
		d.recMu.Unlock()
		ls.Later(record, func(err error) {
			if err != nil {
				d.log.Warn("outbox delivery: recording a pass failed; its messages are delivered again", "err", err)
			}
			recorded(err)
			d.recMu.Lock()
			for _, id := range ids {
				delete(d.recording, id)
			}
			d.recMu.Unlock()
		})
		return accepted, full, errors.Join(d.passErrors(pending, derrs)...)
	}
	err = d.store.Update(ctx, record)
	recorded(err)
	errs := append([]error{err}, d.passErrors(pending, derrs)...)
	return n, full, errors.Join(errs...)
}

// passErrors are a pass's delivery errors, each naming its message.
func (d *Deliverer) passErrors(pending []*Message, derrs []error) []error {
	var errs []error
	for i, derr := range derrs {
		if derr != nil {
			errs = append(errs, fmt.Errorf("deliver %s: %w", pending[i].MessageID, derr))
		}
	}
	return errs
}
