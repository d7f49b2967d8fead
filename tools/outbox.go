package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"idemgate/ledger"
)

// The outbox: messages are written in the same transaction as the
// operation that sends them, and delivered afterwards by a Deliverer. Each
// message has a stable id derived from its operation key and step, which is
// what makes redelivery harmless at an idempotent sink.
const (
	collOutbox  = "outbox"         // message_id → Message
	collPending = "outbox_pending" // message_id → "" while not delivered
	collByOp    = "outbox_by_op"   // tenant \x00 key \x00 step → message_id
)

// Message is one outbound notification.
type Message struct {
	MessageID    string    `json:"message_id"`
	Tenant       string    `json:"tenant"`
	OperationKey string    `json:"operation_key"`
	Step         string    `json:"step"`
	Channel      string    `json:"channel"`
	To           []string  `json:"to"`
	Subject      string    `json:"subject,omitempty"`
	Body         string    `json:"body"`
	OrderID      string    `json:"order_id,omitempty"`
	State        string    `json:"state"` // queued, delivered
	Attempts     int       `json:"attempts"`
	LastError    string    `json:"last_error,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	DeliveredAt  time.Time `json:"delivered_at,omitzero"`
}

// messageID is the stable identity of one side effect of an operation.
func messageID(tenant, key, step string) string {
	sum := sha256.Sum256([]byte("message\x00" + tenant + "\x00" + key + "\x00" + step))
	return "msg_" + hex.EncodeToString(sum[:16])
}

// enqueue writes m into the outbox inside the caller's transaction.
func enqueue(tx ledger.Tx, m *Message) error {
	m.MessageID = messageID(m.Tenant, m.OperationKey, m.Step)
	m.State = "queued"
	m.CreatedAt = tx.Now()
	v, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := tx.Put(collOutbox, m.MessageID, v); err != nil {
		return err
	}
	if err := tx.Put(collPending, m.MessageID, nil); err != nil {
		return err
	}
	return tx.Put(collByOp, m.Tenant+"\x00"+m.OperationKey+"\x00"+m.Step, []byte(m.MessageID))
}

func getMessage(tx ledger.Tx, id string) (*Message, error) {
	v, err := tx.Get(collOutbox, id)
	if err != nil || v == nil {
		return nil, err
	}
	var m Message
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, fmt.Errorf("outbox message %s: %w", id, err)
	}
	return &m, nil
}

// messagesOf returns the messages of an operation, by step.
func messagesOf(tx ledger.Tx, tenant, key string) ([]*Message, error) {
	var out []*Message
	err := tx.Scan(collByOp, tenant+"\x00"+key+"\x00", false, func(_ string, id []byte) (bool, error) {
		m, err := getMessage(tx, string(id))
		if err == nil && m != nil {
			out = append(out, m)
		}
		return true, err
	})
	return out, err
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
// file is created at most once (hard link of a fully written temporary
// file, which fails if the name exists), so redelivery cannot duplicate or
// change a message. Files are fsynced in Flush, together, so a pass of many
// messages costs about one disk flush instead of one each.
type DirSink struct {
	dir     string
	mu      sync.Mutex
	written []string // files to fsync at the next Flush
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
		d.remember(final) // may be a file of a delivery that crashed before its flush
		return nil
	}
	b, err := json.MarshalIndent(map[string]any{
		"message_id": m.MessageID, "channel": m.Channel, "to": m.To, "subject": m.Subject,
		"body": m.Body, "order_id": m.OrderID, "operation_key": m.OperationKey, "step": m.Step,
	}, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(d.dir, ".tmp-"+m.MessageID+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), final); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	d.remember(final)
	return nil
}

func (d *DirSink) remember(path string) {
	d.mu.Lock()
	d.written = append(d.written, path)
	d.mu.Unlock()
}

// Flush implements Sink: it fsyncs the files delivered since the last
// Flush and the directory that names them.
func (d *DirSink) Flush() error {
	d.mu.Lock()
	files := d.written
	d.written = nil
	d.mu.Unlock()
	if len(files) == 0 {
		return nil
	}
	var errs []error
	for _, name := range append(files, d.dir) {
		f, err := os.Open(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, f.Sync(), f.Close())
	}
	if err := errors.Join(errs...); err != nil {
		d.mu.Lock()
		d.written = append(d.written, files...) // try again next time
		d.mu.Unlock()
		return err
	}
	return nil
}

// Deliverer moves queued messages from the outbox to a sink.
type Deliverer struct {
	store ledger.Store
	sink  Sink
	log   *slog.Logger
	kick  chan struct{}
	// Interval is how often the outbox is scanned without a kick (messages
	// left by a process that stopped before delivering them).
	Interval time.Duration
	// Gather is how long a kicked pass waits for more messages to join it.
	Gather time.Duration
}

// NewDeliverer returns a deliverer; start it with Run.
func NewDeliverer(store ledger.Store, sink Sink, log *slog.Logger) *Deliverer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Deliverer{store: store, sink: sink, log: log, kick: make(chan struct{}, 1), Interval: time.Second, Gather: 20 * time.Millisecond}
}

// Kick asks for a delivery pass soon; it never blocks.
func (d *Deliverer) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run delivers until ctx is done; it returns then.
func (d *Deliverer) Run(ctx context.Context) {
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	for {
		if _, err := d.DeliverPending(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("outbox delivery", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
			// Let a burst of operations queue up, so one pass (and one
			// commit) delivers them all instead of one commit each.
			select {
			case <-ctx.Done():
				return
			case <-time.After(d.Gather):
			}
		case <-t.C:
		}
	}
}

// DeliverPending delivers every queued message once, with no transaction
// open during delivery, and returns how many were delivered.
func (d *Deliverer) DeliverPending(ctx context.Context) (int, error) {
	var pending []*Message
	err := d.store.View(ctx, func(tx ledger.Tx) error {
		return tx.Scan(collPending, "", false, func(id string, _ []byte) (bool, error) {
			m, err := getMessage(tx, id)
			if m != nil {
				pending = append(pending, m)
			}
			return len(pending) < 500, err
		})
	})
	if err != nil {
		return 0, err
	}
	// Deliver everything first (no transaction open), then record every
	// outcome in one transaction: one commit per pass, not per message.
	derrs := make([]error, len(pending))
	for i, m := range pending {
		derrs[i] = d.sink.Deliver(ctx, m)
	}
	if err := d.sink.Flush(); err != nil {
		return 0, fmt.Errorf("outbox sink flush: %w", err) // nothing recorded: the next pass redelivers
	}
	n := 0
	err = d.store.Update(ctx, func(tx ledger.Tx) error {
		n = 0
		for i, m := range pending {
			cur, err := getMessage(tx, m.MessageID)
			if err != nil {
				return err
			}
			if cur == nil || cur.State == "delivered" {
				continue
			}
			cur.Attempts++
			if derrs[i] != nil {
				cur.LastError = derrs[i].Error()
			} else {
				cur.State, cur.LastError, cur.DeliveredAt = "delivered", "", tx.Now()
				if err := tx.Delete(collPending, cur.MessageID); err != nil {
					return err
				}
				n++
			}
			v, err := json.Marshal(cur)
			if err != nil {
				return err
			}
			if err := tx.Put(collOutbox, cur.MessageID, v); err != nil {
				return err
			}
		}
		return nil
	})
	errs := []error{err}
	for i, derr := range derrs {
		if derr != nil {
			errs = append(errs, fmt.Errorf("deliver %s: %w", pending[i].MessageID, derr))
		}
	}
	return n, errors.Join(errs...)
}
