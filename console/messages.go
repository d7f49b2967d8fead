package console

import (
	"errors"
	"net/http"
	"net/url"

	"idemgate/ledger"
	"idemgate/outbox"
)

// deadLimit bounds how many dead-lettered messages the page lists.
const deadLimit = 200

// deadScan bounds how many outbox messages (of every tenant) the
// dead-letter list reads per view; the page says when it was reached.
const deadScan = 10000

// deadLetters returns the tenant's dead-lettered messages (at most
// deadLimit, from at most c.deadScan messages read). Messages that are
// not valid JSON are skipped and logged.
func (c *Console) deadLetters(r *http.Request, tenant string) (*outbox.DeadLetterList, error) {
	var out *outbox.DeadLetterList
	err := c.cfg.Store.View(r.Context(), func(tx ledger.Tx) error {
		var err error
		out, err = outbox.DeadLetters(tx, tenant, deadLimit, c.deadScan)
		return err
	})
	if err != nil {
		return nil, err
	}
	if n := len(out.Undecodable); n > 0 {
		c.cfg.Logger.Error("console: outbox messages that are not valid JSON were skipped in the dead-letter list", "count", n, "message_ids", out.Undecodable[:min(n, 10)])
	}
	return out, nil
}

// requeue puts one dead-lettered message of the session's tenant back in
// the queue (outbox.Deliverer.Requeue, as `idemgate outbox requeue`); the
// audit log names the approver, the message and the time.
func (c *Console) requeue(w http.ResponseWriter, r *http.Request, id Identity) {
	msgID := r.PathValue("id")
	var m *outbox.Message
	err := c.cfg.Store.View(r.Context(), func(tx ledger.Tx) error {
		var err error
		m, err = outbox.Get(tx, msgID)
		return err
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
