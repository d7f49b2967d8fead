package server

import (
	"runtime"
	"sync"
	"testing"
)

// liveHeap is the heap in use after a full collection: what is still
// reachable.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC() // the first may leave finalizer-held objects for the second
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestHTTPSessionHeapBounded: 10 000 initialize requests from one token,
// none of them ever closed, against the HTTP handler in this process. The
// live heap (after a collection) grows by less than 8 MiB between the
// first 500 sessions and the last: with every session kept, as before
// sessions were capped, it grew by about 9 KB a session, 90 MB for 10 000.
// mcp-go holds at most the per-token cap (the default, 64). This counts
// bytes, not time.
func TestHTTPSessionHeapBounded(t *testing.T) {
	const (
		total  = 10000
		warm   = 500
		bound  = 8 << 20
		rounds = 8 // concurrent clients: their initializes share commits
	)
	url, token, live := testHandler(t, SessionConfig{})
	open := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		next := make(chan struct{})
		for range rounds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					resp, body := do(t, "POST", url+"/mcp", token, "", initialize)
					if resp.StatusCode != 200 || resp.Header.Get("Mcp-Session-Id") == "" {
						t.Errorf("initialize: %d %s", resp.StatusCode, body)
					}
				}
			}()
		}
		for range n {
			next <- struct{}{}
		}
		close(next)
		wg.Wait()
	}
	open(warm)
	before := liveHeap()
	open(total - warm)
	after := liveHeap()
	grew := int64(after) - int64(before)
	t.Logf("live heap after %d sessions: %.1f MiB; after %d: %.1f MiB (%+.1f MiB, %+.0f bytes a session); mcp-go holds %d",
		warm, float64(before)/(1<<20), total, float64(after)/(1<<20), float64(grew)/(1<<20), float64(grew)/float64(total-warm), live.Load())
	if grew >= bound {
		t.Errorf("the live heap grew by %.1f MiB over %d sessions never closed, want less than %d MiB", float64(grew)/(1<<20), total-warm, bound>>20)
	}
	if n := live.Load(); n > DefaultMaxSessionsPerToken {
		t.Errorf("mcp-go holds %d sessions of one token, want at most %d", n, DefaultMaxSessionsPerToken)
	}
}
