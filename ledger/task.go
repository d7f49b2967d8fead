package ledger

import (
	"context"
	"encoding/binary"
	"time"
)

// Background tasks shared by processes. Every server process runs the
// same background loops (the retention sweep, lease expiry and
// reconciliation) over the ledger it shares with the others — replicas on
// one PostgreSQL database, processes on one ledger file. Their
// transitions are safe when run twice at once (each is re-checked in its
// own transaction), but the work is not free: two replicas reconciling
// the same unknown operation ask the order API twice. So a loop takes its
// task before a pass, with TakeTask: one process holds a task at a time,
// and the others skip their pass rather than wait for it. The holder
// keeps it by taking it again each pass; when it stops (EndTask) or dies
// (its hold expires, by the ledger's clock) another process takes it at
// its next pass.
//
// Taking a task is a small write transaction in the downstream
// collections (through Store.Update, so every backend has it); a pass
// that takes longer than the hold may overlap the next holder's, which
// costs duplicate work, never a duplicate transition.

// tasksCollection holds the tasks: name → until (8 bytes BE unix ns, by
// the ledger's clock) followed by the holder's id.
const tasksCollection = "background_tasks"

// TakeTask takes the background task name for holder until hold has
// passed (by the ledger's clock), and reports whether it did: it does
// when no other holder has it or the other's hold has expired, and a
// holder that has it extends it. Errors are the store's.
func TakeTask(ctx context.Context, s Store, name, holder string, hold time.Duration) (bool, error) {
	othersAt := func(tx Tx) (bool, error) {
		v, err := tx.Get(tasksCollection, name)
		if err != nil || len(v) < 8 {
			return false, err
		}
		return string(v[8:]) != holder && time.Unix(0, int64(binary.BigEndian.Uint64(v[:8]))).After(tx.Now()), nil
	}
	// A read first: a process that skips writes nothing.
	others := false
	if err := s.View(ctx, func(tx Tx) error {
		var err error
		others, err = othersAt(tx)
		return err
	}); err != nil || others {
		return false, err
	}
	taken := false
	err := s.Update(ctx, func(tx Tx) error {
		taken = false
		now := tx.Now()
		if others, err := othersAt(tx); err != nil || others {
			return err // another holder's, unexpired
		}
		val := binary.BigEndian.AppendUint64(nil, uint64(now.Add(hold).UnixNano()))
		if err := tx.Put(tasksCollection, name, append(val, holder...)); err != nil {
			return err
		}
		taken = true
		return nil
	})
	return taken && err == nil, err
}

// EndTask gives up the task name if holder has it, so another process
// may take it at once.
func EndTask(ctx context.Context, s Store, name, holder string) error {
	return s.Update(ctx, func(tx Tx) error {
		v, err := tx.Get(tasksCollection, name)
		if err != nil || len(v) < 8 || string(v[8:]) != holder {
			return err
		}
		return tx.Delete(tasksCollection, name)
	})
}
