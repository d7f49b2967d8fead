package server

import (
	"strconv"
	"sync"
)

// largeMessage is the size from which a message takes its bytes from the
// process's message budget while it is read and served; smaller messages
// take nothing.
const largeMessage = 64 << 10

// messageBudgetBytes bounds the bytes of large messages a process holds
// at once, from reading one until it is answered: four messages of the
// largest size (MaxMessageBytes), or many smaller ones. What one message
// costs beyond its bytes is bounded by the envelope (maxMessageValues)
// and the screen of tool arguments (screenArguments), so the memory of
// every large message in flight is bounded as a whole.
const messageBudgetBytes = 4 * MaxMessageBytes

// codeServerBusy is the JSON-RPC error of a message refused because the
// message budget is spent (-32000 to -32099 are for implementations).
const codeServerBusy = -32000

// busyMessage says why a message was refused for the budget and what to
// do: the refusal is temporary.
var busyMessage = "server busy: it holds as many large messages (over " + strconv.Itoa(largeMessage>>10) +
	" KiB) as it may at once (" + strconv.Itoa(messageBudgetBytes>>20) + " MiB); nothing was read or run: retry in a moment"

// messageBudget hands out the bytes of messageBudgetBytes. Safe for
// concurrent use; the zero value is ready.
type messageBudget struct {
	mu   sync.Mutex
	used int
}

// take reserves n bytes for a message and reports whether they were
// free; a message of at most largeMessage bytes always gets them.
func (b *messageBudget) take(n int) bool {
	if n <= largeMessage {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > messageBudgetBytes {
		return false
	}
	b.used += n
	return true
}

// give returns n bytes taken for a message.
func (b *messageBudget) give(n int) {
	if n <= largeMessage {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
}
