// Package demo walks a newcomer through idemgate's guarantees against the
// real server: it starts `idemgate serve` as subprocesses on a temporary
// ledger and talks MCP to them over stdio, printing each step.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"idemgate/owner"
)

// envelope is the part of idemgate's answer the demo prints.
type envelope struct {
	OperationKey string          `json:"operation_key"`
	Status       string          `json:"status"`
	Replayed     bool            `json:"replayed"`
	Result       json.RawMessage `json:"result"`
	Error        *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	NextAction string `json:"next_action"`
}

func (e envelope) orderID() string {
	var r struct {
		Order struct {
			OrderID string `json:"order_id"`
		} `json:"order"`
	}
	json.Unmarshal(e.Result, &r)
	return r.Order.OrderID
}

// Run performs the demo with the idemgate binary at bin.
func Run(ctx context.Context, bin string, out io.Writer, keep bool) error {
	dir, err := os.MkdirTemp("", "idemgate-demo-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Fprintf(out, "(ledger kept in %s)\n", dir)
	}
	db := filepath.Join(dir, "ledger.db")
	if !keep {
		defer os.RemoveAll(dir)
		// Both servers pass their calls to the ledger's owner (see package
		// owner), which ends before its directory goes.
		defer func() {
			if place, err := owner.PlaceOf(db); err == nil {
				owner.Stop(place, 30*time.Second)
			}
		}()
	}
	api, err := startRefundsAPI()
	if err != nil {
		return err
	}
	defer api.Close()
	cfg := filepath.Join(dir, "idemgate.toml")
	if err := os.WriteFile(cfg, []byte(declaration(api.url)), 0o600); err != nil {
		return err
	}
	agentA, err := start(ctx, bin, db, cfg, "agent-a")
	if err != nil {
		return err
	}
	defer agentA.Close()
	agentB, err := start(ctx, bin, db, cfg, "agent-b")
	if err != nil {
		return err
	}
	defer agentB.Close()

	order := map[string]any{
		"customer_id": "cust-42", "currency": "EUR",
		"items": []any{map[string]any{"sku": "coffee-1kg", "quantity": 2, "unit_price_minor": 1850}},
	}
	with := func(key string, extra map[string]any) map[string]any {
		m := map[string]any{"operation_key": key}
		for k, v := range order {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	fmt.Fprintln(out, "idemgate demo: two agent processes share one ledger file.")
	fmt.Fprintln(out)
	key := uuid.NewString()
	fmt.Fprintf(out, "1. Agent A decides to order 2 × coffee for cust-42 and makes ONE operation key for that intent:\n   %s\n", key)
	first, err := call(ctx, agentA, "create_order", with(key, nil))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   create_order → status %s, order %s, replayed %v\n\n", first.Status, first.orderID(), first.Replayed)

	fmt.Fprintln(out, "2. The reply is lost (a timeout). A timeout is not a failure, so the agent retries with the SAME key:")
	again, err := call(ctx, agentA, "create_order", with(key, nil))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   create_order → status %s, order %s, replayed %v  (same order, nothing ran twice)\n\n", again.Status, again.orderID(), again.Replayed)

	fmt.Fprintln(out, "3. A confused retry changes the quantity but reuses the key:")
	changed, err := call(ctx, agentA, "create_order", with(key, map[string]any{
		"items": []any{map[string]any{"sku": "coffee-1kg", "quantity": 20, "unit_price_minor": 1850}},
	}))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   create_order → refused: %s (next: %s)\n\n", changed.Error.Code, changed.NextAction)

	fmt.Fprintln(out, "4. Two agents in two processes pick up the same task at once, 8 calls each, one key:")
	shared := uuid.NewString()
	tea := map[string]any{"items": []any{map[string]any{"sku": "tea-500g", "quantity": 1, "unit_price_minor": 990}}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	orders := map[string]int{}
	replays := 0
	var firstErr error
	for i := 0; i < 16; i++ {
		c := agentA
		if i%2 == 1 {
			c = agentB
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := call(ctx, c, "create_order", with(shared, tea))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			orders[e.orderID()]++
			if e.Replayed {
				replays++
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	fmt.Fprintf(out, "   16 calls → %d distinct order(s) %v; %d answers were replays\n\n", len(orders), keys(orders), replays)

	fmt.Fprintln(out, "5. A buggy retry loop mints a NEW key for the first intent:")
	dup, err := call(ctx, agentB, "create_order", with(uuid.NewString(), nil))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   create_order → %s: held for a human, names the earlier key %s\n\n", dup.Status, key)

	list, err := call(ctx, agentB, "list_orders", map[string]any{"customer_id": "cust-42"})
	if err != nil {
		return err
	}
	var l struct {
		Count int `json:"count"`
	}
	json.Unmarshal(list.Result, &l)
	fmt.Fprintf(out, "   cust-42 has %d orders: one per intent.\n\n", l.Count)
	if len(orders) != 1 || first.orderID() != again.orderID() || l.Count != 2 {
		return fmt.Errorf("demo: the guarantees did not hold (orders %v, count %d)", orders, l.Count)
	}

	fmt.Fprintf(out, "6. Your own API behind the gate: create_refund is declared in the configuration (%s),\n", filepath.Base(cfg))
	fmt.Fprintln(out, "   a refunds API reached over HTTP with the key as Idempotency-Key. Its first reply is lost after the refund is made:")
	refund := map[string]any{"operation_key": uuid.NewString(), "payment_id": "pay_123", "amount_minor": 1500, "currency": "EUR"}
	lost, err := call(ctx, agentA, "create_refund", refund)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   create_refund → status %s (%s): nothing will be re-sent blindly\n", lost.Status, errCode(lost))
	settled, err := call(ctx, agentB, "create_refund", refund)
	if err != nil {
		return err
	}
	var rr struct {
		Refund struct {
			ID string `json:"id"`
		} `json:"refund"`
	}
	json.Unmarshal(settled.Result, &rr)
	fmt.Fprintf(out, "   the same key again → status %s, refund %s: found by the API's lookup, not made again\n", settled.Status, rr.Refund.ID)
	replay, err := call(ctx, agentA, "create_refund", refund)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "   once more → status %s, replayed %v; refunds made at the API: %d\n", replay.Status, replay.Replayed, api.refunds())
	if lost.Status != "unknown" || settled.Status != "succeeded" || !replay.Replayed || api.refunds() != 1 {
		return fmt.Errorf("demo: the declared tool's guarantees did not hold (%s, %s, replayed %v, %d refunds)", lost.Status, settled.Status, replay.Replayed, api.refunds())
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "One intent, one effect, whatever the network did.")
	return nil
}

func errCode(e envelope) string {
	if e.Error == nil {
		return "no error"
	}
	return e.Error.Code
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func start(ctx context.Context, bin, db, config, principal string) (*client.Client, error) {
	t := transport.NewStdioWithOptions(bin, nil, []string{"serve", "--db", db, "--config", config, "--principal", principal, "--log-level", "warn"},
		transport.WithCommandStderrWriter(io.Discard))
	if err := t.Start(ctx); err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	c := client.NewClient(t)
	req := mcp.InitializeRequest{}
	req.Params.ClientInfo = mcp.Implementation{Name: "idemgate-demo", Version: "1"}
	if _, err := c.Initialize(ctx, req); err != nil {
		c.Close()
		return nil, fmt.Errorf("initialize: %w", err)
	}
	return c, nil
}

func call(ctx context.Context, c *client.Client, tool string, args map[string]any) (envelope, error) {
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return envelope{}, fmt.Errorf("%s: %w", tool, err)
	}
	var e envelope
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return e, err
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("%s: answer is not the idemgate envelope: %w", tool, err)
	}
	return e, nil
}
