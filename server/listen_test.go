package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestHTTPListenAcknowledgedFirst: every subscriptions/listen stream
// (protocol 2026-07-28) starts with notifications/subscriptions/acknowledged
// tagged with the request's id, and ends with the result, also tagged —
// on every one of many requests, since mcp-go v1.2.1 alone drops the
// acknowledgement on some of them (see awaitListenAcks).
func TestHTTPListenAcknowledgedFirst(t *testing.T) {
	url, token, _ := testHandler(t, SessionConfig{})
	const n = 500
	for i := range n {
		id := 1000 + i
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, id)
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "subscriptions/listen")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		frames := sseFrames(t, resp)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("listen %d: %d %s, want 200 and an event stream", i, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if len(frames) != 2 {
			t.Fatalf("listen %d: %d messages %v, want the acknowledgement and the result", i, len(frames), frames)
		}
		var ack struct {
			Method string `json:"method"`
			Params struct {
				Meta          map[string]any `json:"_meta"`
				Notifications map[string]any `json:"notifications"`
			} `json:"params"`
		}
		if err := json.Unmarshal([]byte(frames[0]), &ack); err != nil || ack.Method != "notifications/subscriptions/acknowledged" {
			t.Fatalf("listen %d: first message %s, want notifications/subscriptions/acknowledged", i, frames[0])
		}
		if got := ack.Params.Meta["io.modelcontextprotocol/subscriptionId"]; got != float64(id) {
			t.Errorf("listen %d: acknowledgement tagged %v, want %d", i, got, id)
		}
		// idemgate's tool list never changes, so nothing is established.
		if len(ack.Params.Notifications) != 0 {
			t.Errorf("listen %d: acknowledged %v, want nothing established", i, ack.Params.Notifications)
		}
		var res struct {
			ID     any `json:"id"`
			Result struct {
				Meta map[string]any `json:"_meta"`
			} `json:"result"`
		}
		if err := json.Unmarshal([]byte(frames[1]), &res); err != nil || res.ID != float64(id) {
			t.Fatalf("listen %d: last message %s, want the result of request %d", i, frames[1], id)
		}
		if got := res.Result.Meta["io.modelcontextprotocol/subscriptionId"]; got != float64(id) {
			t.Errorf("listen %d: result tagged %v, want %d", i, got, id)
		}
	}
}

// sseFrames reads resp's body to its end and returns the data of each
// server-sent event (or the body itself when it is plain JSON).
func sseFrames(t *testing.T, resp *http.Response) []string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	raw := string(b)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return []string{strings.TrimSpace(raw)}
	}
	var frames []string
	for _, line := range strings.Split(raw, "\n") {
		if data, ok := strings.CutPrefix(line, "data:"); ok {
			frames = append(frames, strings.TrimSpace(data))
		}
	}
	return frames
}
