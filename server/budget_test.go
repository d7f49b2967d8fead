package server

import "testing"

// TestMessageBudget: small messages take nothing; large ones share
// messageBudgetBytes, and what is given back can be taken again.
func TestMessageBudget(t *testing.T) {
	var b messageBudget
	for range 100 {
		if !b.take(largeMessage) {
			t.Fatal("a message of largeMessage bytes was refused")
		}
	}
	for i := range 4 {
		if !b.take(MaxMessageBytes) {
			t.Fatalf("message %d of the largest size refused; the budget holds four", i+1)
		}
	}
	if b.take(largeMessage + 1) {
		t.Fatal("a large message taken beyond the budget")
	}
	b.give(MaxMessageBytes)
	if !b.take(MaxMessageBytes) {
		t.Fatal("the bytes given back could not be taken again")
	}
	if b.take(MaxMessageBytes) {
		t.Fatal("a fifth message of the largest size taken")
	}
}
