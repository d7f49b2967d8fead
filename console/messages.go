package console

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"idemgate/ledger"
	"idemgate/outbox"
)

// deadScan bounds how many outbox messages the dead-letter list reads.
const deadScan = 10000

// deadLetters returns the tenant's dead-lettered messages (at most 200).
func (c *Console) deadLetters(r *http.Request, tenant string) ([]*outbox.Message, error) {
	var out []*outbox.Message
	n := 0
	err := c.cfg.Store.View(r.Context(), func(tx ledger.Tx) error {
		return tx.Scan(outbox.Collection, "", true, func(_ string, v []byte) (bool, error) {
			n++
			var m outbox.Message
			if json.Unmarshal(v, &m) == nil && m.Tenant == tenant && m.State == outbox.MessageDead {
				out = append(out, &m)
			}
			return n < deadScan && len(out) < 200, nil
		})
	})
	return out, err
}

// requeue puts one dead-lettered message of the session's tenant back in
// the queue (outbox.Deliverer.Requeue, as `idemgate outbox requeue`); the
// audit log names the approver, the message and the time.
func (c *Console) requeue(w http.ResponseWriter, r *http.Request, id Identity) {
	msgID := r.PathValue("id")
	var m *outbox.Message
	err := c.cfg.Store.View(r.Context(), func(tx ledger.Tx) error {
		v, err := tx.Get(outbox.Collection, msgID)
		if err != nil || v == nil {
			return err
		}
		m = new(outbox.Message)
		return json.Unmarshal(v, m)
	})
	if err != nil {
		c.apiError(w, r, id, err)
		return
	}
	if m == nil || m.Tenant != id.Tenant {
		c.errorPage(w, r, &id, http.StatusNotFound, "No message with this id in your tenant.")
		return
	}
	err = c.cfg.Service.Deliverer().Requeue(r.Context(), msgID, actor(id)) // audited with the requeue
	if errors.Is(err, outbox.ErrMessageNotDead) {
		c.errorPage(w, r, &id, http.StatusConflict, "This message is not dead-lettered (any more): nothing to requeue.")
		return
	}
	if err != nil {
		c.apiError(w, r, id, err)
		return
	}
	c.cfg.Logger.Info("console: requeue", "principal", id.Principal, "tenant", id.Tenant, "message", msgID)
	if c.cfg.AfterDecide != nil {
		c.cfg.AfterDecide(r.Context())
	}
	http.Redirect(w, r, Prefix+"/attention?requeued="+url.QueryEscape(msgID), http.StatusSeeOther)
}
