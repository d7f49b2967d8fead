package ledgertest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"idemgate/ledger"
)

// RunAuditPrune checks audit retention on the ledgers open's backends
// make: pruning the oldest entries keeps the rest verifiable from the
// anchor, tampering with a kept entry or with the anchor is detected, and
// an archive (export) of the pruned part verifies and continues into the
// ledger. open must return a new, empty backend each time; the test puts a
// ledger on it and, to tamper, writes to it directly.
func RunAuditPrune(t *testing.T, open func(t *testing.T) ledger.Backend) {
	cases := []struct {
		name string
		run  func(t *testing.T, p *pruneEnv)
	}{
		{"PruneThenVerify", prunePruneThenVerify},
		{"ArchiveRoundTrip", pruneArchiveRoundTrip},
		{"TamperedKeptEntryFails", pruneTamperedKept},
		{"TamperedAnchorHashFails", pruneTamperedAnchor(func(p *pruneEnv, a ledger.AuditAnchor) {
			a.Hash = strings.Repeat("0", 64)
			p.setAnchor(a)
		})},
		{"TamperedAnchorSeqFails", pruneTamperedAnchor(func(p *pruneEnv, a ledger.AuditAnchor) {
			a.Seq--
			p.setAnchor(a)
		})},
		{"RemovedAnchorFails", pruneTamperedAnchor(func(p *pruneEnv, a ledger.AuditAnchor) {
			p.raw(ledger.MetaCollection, []byte("audit_anchor"), func([]byte) []byte { return nil })
		})},
		{"AnchorMovedOverDeletedEntryFails", pruneTamperedAnchor(func(p *pruneEnv, a ledger.AuditAnchor) {
			// Delete the first kept entry and move the anchor onto it, so
			// the chain link holds: the prune record still names the old
			// anchor.
			first := p.log()[0]
			p.raw(ledger.AuditCollection, seqKey(first.Seq), func([]byte) []byte { return nil })
			a.Seq, a.Hash = first.Seq, first.Hash
			p.setAnchor(a)
		})},
		{"ManyBatchesAndTwoPrunes", pruneManyBatches},
		{"LongLogVerifiedInChunks", pruneLongLog},
		{"RefusesBrokenChainAndFuture", pruneRefuses},
		{"ArchiveFailurePrunesNothing", pruneArchiveFails},
		{"CutTailFound", pruneCutTail},
		{"CheckpointHeld", pruneCheckpoint},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := open(t)
			clock := newFakeClock()
			o := Opts()
			o.Now, o.Elapsed = clock.Now, clock.Elapsed
			l := ledger.New(b, o)
			t.Cleanup(func() { l.Close() })
			tc.run(t, &pruneEnv{t: t, ctx: context.Background(), b: b, l: l, clock: clock})
		})
	}
}

type pruneEnv struct {
	t     *testing.T
	ctx   context.Context
	b     ledger.Backend
	l     *ledger.Ledger
	clock *fakeClock
}

// memArchive keeps what a prune archives, as the JSON lines of an export.
type memArchive struct {
	lines   [][]byte
	undone  int
	failing bool
}

func (a *memArchive) Write(entries []ledger.AuditEntry) (string, error) {
	if a.failing {
		return "", errors.New("disk full")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, e := range entries {
		if err := enc.Encode(e); err != nil {
			return "", err
		}
	}
	a.lines = append(a.lines, buf.Bytes())
	return fmt.Sprintf("archived %d entries", len(entries)), nil
}

func (a *memArchive) Undo() error {
	a.lines = a.lines[:len(a.lines)-1]
	a.undone++
	return nil
}

// entries decodes the archive as an importer would.
func (a *memArchive) entries(t *testing.T) []ledger.AuditEntry {
	t.Helper()
	var out []ledger.AuditEntry
	dec := json.NewDecoder(bytes.NewReader(bytes.Join(a.lines, nil)))
	for dec.More() {
		var e ledger.AuditEntry
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("archive: %v", err)
		}
		out = append(out, e)
	}
	return out
}

// ops runs n operations of tenant, an hour apart, and returns their keys.
func (p *pruneEnv) ops(tenant string, n int) []string {
	p.t.Helper()
	var keys []string
	ap := &applier{}
	for range n {
		c := newClaim(tenant, "create_order", "fp-"+fmt.Sprint(p.clock.Now().UnixNano()))
		d, err := p.l.Execute(p.ctx, c, ap.succeed(ResultOrder))
		if err != nil || d.Kind != ledger.DecisionExecuted {
			p.t.Fatalf("Execute = %v, %v", d.Kind, err)
		}
		p.l.Audit(ledger.AuditEntry{Event: "call", Actor: c.Actor, Tool: c.Tool, Key: c.Key, Decision: "replayed"})
		keys = append(keys, c.Key)
		p.clock.Advance(time.Hour)
	}
	return keys
}

// log returns the whole kept log.
func (p *pruneEnv) log() []ledger.AuditEntry {
	p.t.Helper()
	es, err := p.l.AuditLog(p.ctx, 0, 0)
	if err != nil {
		p.t.Fatal(err)
	}
	return es
}

// raw rewrites the stored value of key in collection with fn, below the
// ledger, as an attacker with the file would (fn returning nil deletes).
func (p *pruneEnv) raw(collection string, key []byte, fn func(v []byte) []byte) {
	p.t.Helper()
	p.log() // flush buffered entries first
	err := p.b.Update(p.ctx, func(tx ledger.BTx) error {
		bk := tx.Bucket([]byte(collection))
		v := fn(bytes.Clone(bk.Get(key)))
		if v == nil {
			return bk.Delete(key)
		}
		return bk.Put(key, v)
	})
	if err != nil {
		p.t.Fatal(err)
	}
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

var pruner = ledger.Actor{Principal: "audit-prune"}

func prunePruneThenVerify(t *testing.T, p *pruneEnv) {
	old := p.ops("t1", 3)
	cutoff := p.clock.Now()
	kept := p.ops("t1", 2)
	before := p.log()
	var nOld int
	for _, e := range before {
		if e.At.Before(cutoff) {
			nOld++
		}
	}
	p.clock.Advance(time.Hour)
	arch := &memArchive{}
	res, err := p.l.PruneAudit(p.ctx, cutoff, pruner, arch)
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != nOld || res.Anchor.Seq != uint64(nOld) || res.Anchor.Hash != before[nOld-1].Hash {
		t.Fatalf("PruneAudit = %d entries, anchor %d %.12s; want %d, anchor %d %.12s", res.Entries, res.Anchor.Seq, res.Anchor.Hash, nOld, nOld, before[nOld-1].Hash)
	}
	after := p.log()
	if got, want := len(after), len(before)-nOld+1; got != want {
		t.Fatalf("kept %d entries; want %d (the newer ones and the prune record)", got, want)
	}
	if after[0].Seq != uint64(nOld+1) || after[0].Hash != before[nOld].Hash {
		t.Errorf("first kept entry = %d; want %d, unchanged", after[0].Seq, nOld+1)
	}
	last := after[len(after)-1]
	if last.Event != ledger.EventAuditPruned || last.Actor.Principal != "audit-prune" || !strings.Contains(last.Detail, fmt.Sprintf("audit entries 1-%d pruned", nOld)) {
		t.Errorf("newest entry = %s %q; want the prune record", last.Event, last.Detail)
	}
	v, err := p.l.VerifyAuditChain(p.ctx, nil)
	if err != nil {
		t.Fatalf("verify after prune: %v", err)
	}
	if v.Anchor == nil || v.Anchor.Seq != uint64(nOld) || v.First != uint64(nOld+1) || v.Entries != len(after) {
		t.Errorf("VerifyAuditChain = %+v; want anchor %d, first %d, %d entries", v, nOld, nOld+1, len(after))
	}
	if n, err := p.l.VerifyAudit(p.ctx); err != nil || n != len(after) {
		t.Errorf("VerifyAudit = %d, %v; want %d, nil", n, err, len(after))
	}
	// The per-key index forgets pruned entries; kept keys keep theirs.
	if es, total, err := p.l.AuditForKey(p.ctx, "t1", old[0], 0); err != nil || len(es) != 0 || total != 0 {
		t.Errorf("AuditForKey(pruned key) = %d entries (total %d), %v; want none", len(es), total, err)
	}
	if es, total, err := p.l.AuditForKey(p.ctx, "t1", kept[0], 0); err != nil || len(es) == 0 || total != len(es) {
		t.Errorf("AuditForKey(kept key) = %d entries (total %d), %v; want its entries", len(es), total, err)
	}
	// New entries chain on after the prune record.
	p.ops("t1", 1)
	if _, err := p.l.VerifyAuditChain(p.ctx, nil); err != nil {
		t.Errorf("verify after more writes: %v", err)
	}
	// The records themselves are untouched: a pruned operation replays.
	if rec, err := p.l.Get(p.ctx, "t1", old[2]); err != nil || rec.State != ledger.StateSucceeded {
		t.Errorf("record of a pruned entry's key: %v, %v", rec, err)
	}
}

func pruneArchiveRoundTrip(t *testing.T, p *pruneEnv) {
	p.ops("t1", 4)
	cutoff := p.clock.Now()
	p.ops("t1", 2)
	whole := p.log()
	// An export of a log never pruned verifies and continues into it.
	var full ledger.AuditChain
	for _, e := range whole {
		if err := full.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.l.VerifyAuditChain(p.ctx, &full); err != nil {
		t.Fatalf("export of the whole log against the ledger: %v", err)
	}
	arch := &memArchive{}
	if _, err := p.l.PruneAudit(p.ctx, cutoff, pruner, arch); err != nil {
		t.Fatal(err)
	}
	got := arch.entries(t)
	var c ledger.AuditChain
	for i, e := range got {
		if e.Hash != whole[i].Hash || e.Seq != whole[i].Seq {
			t.Fatalf("archived entry %d = seq %d %.12s; want seq %d %.12s", i, e.Seq, e.Hash, whole[i].Seq, whole[i].Hash)
		}
		if err := c.Add(e); err != nil {
			t.Fatalf("re-imported archive: %v", err)
		}
	}
	if c.First != 1 || c.N != len(got) {
		t.Errorf("archive chain = first %d, %d entries; want 1, %d", c.First, c.N, len(got))
	}
	if _, err := p.l.VerifyAuditChain(p.ctx, &c); err != nil {
		t.Fatalf("archive + ledger: %v", err)
	}
	// An archive missing its last entry does not reach the anchor.
	var short ledger.AuditChain
	for _, e := range got[:len(got)-1] {
		if err := short.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.l.VerifyAuditChain(p.ctx, &short); err == nil || !strings.Contains(err.Error(), "archive is missing or was changed") {
		t.Errorf("verify with a truncated archive = %v; want the gap named", err)
	}
	// An edited archive entry fails its own chain.
	edited := got[1]
	edited.Decision = "approved by nobody"
	var bad ledger.AuditChain
	if err := bad.Add(got[0]); err != nil {
		t.Fatal(err)
	}
	if err := bad.Add(edited); err == nil {
		t.Error("an edited archive entry was accepted")
	}
	// A missing entry in the middle of an archive is named.
	var gap ledger.AuditChain
	if err := gap.Add(got[0]); err != nil {
		t.Fatal(err)
	}
	if err := gap.Add(got[2]); err == nil {
		t.Error("an archive with a gap was accepted")
	}
}

func pruneTamperedKept(t *testing.T, p *pruneEnv) {
	p.ops("t1", 3)
	cutoff := p.clock.Now()
	p.ops("t1", 2)
	res, err := p.l.PruneAudit(p.ctx, cutoff, pruner, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept := res.Anchor.Seq + 2
	p.raw(ledger.AuditCollection, seqKey(kept), func(v []byte) []byte {
		return bytes.Replace(v, []byte(`"event":"`), []byte(`"event":"x`), 1)
	})
	if _, err := p.l.VerifyAuditChain(p.ctx, nil); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("audit entry %d", kept)) {
		t.Errorf("verify with kept entry %d edited = %v; want it named", kept, err)
	}
}

// pruneLongLog: a log longer than one verification transaction reads
// (4096 entries) verifies whole, after a prune too; an entry edited in a
// later chunk, and an entry removed at a chunk's boundary, are found.
func pruneLongLog(t *testing.T, p *pruneEnv) {
	p.ops("t1", 2)
	cutoff := p.clock.Now()
	const n = 10000
	for i := range n {
		p.l.Audit(ledger.AuditEntry{Event: ledger.EventCall, Actor: ledger.Actor{Principal: "p", Tenant: "t1"}, Tool: "get_order", Key: fmt.Sprint("k", i), Decision: "read"})
	}
	whole := len(p.log())
	if res, err := p.l.VerifyAuditChain(p.ctx, nil); err != nil || res.Entries != whole {
		t.Fatalf("verify of %d entries = %+v, %v; want them all", whole, res, err)
	}
	pr, err := p.l.PruneAudit(p.ctx, cutoff, pruner, nil)
	if err != nil || pr.Entries == 0 {
		t.Fatalf("prune = %+v, %v", pr, err)
	}
	kept := p.log()
	res, err := p.l.VerifyAuditChain(p.ctx, nil)
	if err != nil || res.Entries != len(kept) || res.First != kept[0].Seq || res.Last != kept[len(kept)-1].Seq {
		t.Fatalf("verify after the prune = %+v, %v; want entries %d-%d", res, err, kept[0].Seq, kept[len(kept)-1].Seq)
	}
	edited := kept[len(kept)-10].Seq // in the third transaction
	p.raw(ledger.AuditCollection, seqKey(edited), func(v []byte) []byte {
		return bytes.Replace(v, []byte(`"tool":"get_order"`), []byte(`"tool":"get_orders"`), 1)
	})
	if _, err := p.l.VerifyAuditChain(p.ctx, nil); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("audit entry %d", edited)) {
		t.Errorf("verify with entry %d edited = %v; want it named", edited, err)
	}
	p.raw(ledger.AuditCollection, seqKey(edited), func([]byte) []byte { return nil })
	boundary := kept[4096].Seq // the first entry of the second transaction
	p.raw(ledger.AuditCollection, seqKey(boundary), func([]byte) []byte { return nil })
	if _, err := p.l.VerifyAuditChain(p.ctx, nil); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("audit entry %d", boundary+1)) {
		t.Errorf("verify with entry %d removed = %v; want the entry after it named", boundary, err)
	}
}

// pruneTamperedAnchor returns a case that prunes, tampers with the anchor
// by tamper, and expects verification to fail.
func pruneTamperedAnchor(tamper func(p *pruneEnv, a ledger.AuditAnchor)) func(t *testing.T, p *pruneEnv) {
	return func(t *testing.T, p *pruneEnv) {
		p.ops("t1", 3)
		cutoff := p.clock.Now()
		p.ops("t1", 2)
		res, err := p.l.PruneAudit(p.ctx, cutoff, pruner, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.l.VerifyAuditChain(p.ctx, nil); err != nil {
			t.Fatalf("verify before tampering: %v", err)
		}
		tamper(p, res.Anchor)
		_, err = p.l.VerifyAuditChain(p.ctx, nil)
		if err == nil {
			t.Fatal("verify with the anchor tampered passed")
		}
		t.Logf("verify: %v", err)
	}
}

// setAnchor stores a as the ledger's anchor, below the ledger.
func (p *pruneEnv) setAnchor(a ledger.AuditAnchor) {
	p.t.Helper()
	v, err := json.Marshal(a)
	if err != nil {
		p.t.Fatal(err)
	}
	p.raw(ledger.MetaCollection, []byte("audit_anchor"), func([]byte) []byte { return v })
}

func pruneManyBatches(t *testing.T, p *pruneEnv) {
	// 1200 buffered call entries: more than two prune transactions' worth.
	for i := range 1200 {
		p.l.Audit(ledger.AuditEntry{Event: "call", Actor: testActor("t1"), Tool: "get_order", Key: fmt.Sprintf("k%d", i%7), Decision: "read"})
		if i%100 == 0 {
			p.clock.Advance(time.Minute)
		}
	}
	p.log()
	p.clock.Advance(time.Hour)
	first := p.clock.Now()
	p.ops("t1", 2)
	arch := &memArchive{}
	res, err := p.l.PruneAudit(p.ctx, first, pruner, arch)
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 1200 || len(arch.lines) < 3 {
		t.Fatalf("PruneAudit = %d entries in %d archive writes; want 1200 in at least 3", res.Entries, len(arch.lines))
	}
	var prunes int
	for _, e := range p.log() {
		if e.Event == ledger.EventAuditPruned {
			prunes++
		}
	}
	if prunes != len(arch.lines) {
		t.Errorf("%d prune records for %d transactions", prunes, len(arch.lines))
	}
	// A second prune, later, takes the first one's records too; both
	// archives, in order, still continue into the ledger.
	p.clock.Advance(time.Hour)
	second := &memArchive{}
	if _, err := p.l.PruneAudit(p.ctx, p.clock.Now(), pruner, second); err != nil {
		t.Fatal(err)
	}
	var c ledger.AuditChain
	for _, e := range append(arch.entries(t), second.entries(t)...) {
		if err := c.Add(e); err != nil {
			t.Fatalf("both archives: %v", err)
		}
	}
	v, err := p.l.VerifyAuditChain(p.ctx, &c)
	if err != nil {
		t.Fatalf("verify after two prunes: %v", err)
	}
	if v.Entries != prunesAfter(p) || v.Anchor == nil || v.Anchor.Seq != c.Last {
		t.Errorf("after two prunes: %+v, archive to %d", v, c.Last)
	}
	if es, total, err := p.l.AuditForKey(p.ctx, "t1", "k3", 0); err != nil || len(es) != 0 || total != 0 {
		t.Errorf("AuditForKey(k3) after its entries were pruned = %d (total %d), %v", len(es), total, err)
	}
}

func prunesAfter(p *pruneEnv) int { return len(p.log()) }

func pruneRefuses(t *testing.T, p *pruneEnv) {
	p.ops("t1", 3)
	cutoff := p.clock.Now()
	p.ops("t1", 1)
	if _, err := p.l.PruneAudit(p.ctx, p.clock.Now().Add(time.Minute), pruner, nil); err == nil {
		t.Error("a prune before a time in the future was accepted")
	}
	p.raw(ledger.AuditCollection, seqKey(2), func(v []byte) []byte {
		return bytes.Replace(v, []byte(`"event":"`), []byte(`"event":"x`), 1)
	})
	arch := &memArchive{}
	res, err := p.l.PruneAudit(p.ctx, cutoff, pruner, arch)
	if err == nil || !strings.Contains(err.Error(), "audit entry 2") || res.Entries != 0 || len(arch.lines) != 0 {
		t.Fatalf("prune of a tampered log = %d entries, %d archived, %v; want a refusal naming entry 2", res.Entries, len(arch.lines), err)
	}
	if es := p.log(); es[0].Seq != 1 {
		t.Errorf("the log starts at %d after a refused prune; want 1", es[0].Seq)
	}
}

func pruneArchiveFails(t *testing.T, p *pruneEnv) {
	p.ops("t1", 2)
	cutoff := p.clock.Now()
	p.ops("t1", 1)
	n := len(p.log())
	res, err := p.l.PruneAudit(p.ctx, cutoff, pruner, &memArchive{failing: true})
	if err == nil || res.Entries != 0 {
		t.Fatalf("prune with a failing archive = %d, %v; want an error, nothing pruned", res.Entries, err)
	}
	if got := len(p.log()); got != n {
		t.Errorf("%d entries after a failed prune; want %d", got, n)
	}
	if a, err := p.l.AuditAnchorOf(p.ctx); err != nil || a != nil {
		t.Errorf("anchor after a failed prune = %v, %v; want none", a, err)
	}
}

// pruneCutTail: removing the newest entries is found by the numbers the
// ledger keeps outside the chain — the index's watermark, then, when that
// is set back too, a record that numbers a removed transition — before a
// prune and after it, and the good entries before are counted.
func pruneCutTail(t *testing.T, p *pruneEnv) {
	p.ops("t1", 3)
	cutoff := p.clock.Now()
	p.ops("t1", 2)
	check := func(when string, last uint64, want string) {
		t.Helper()
		res, err := p.l.VerifyAuditChain(p.ctx, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: verify = %v; want %q", when, err, want)
		}
		if res.Last != last {
			t.Errorf("%s: verify checked through entry %d; want %d", when, res.Last, last)
		}
	}
	for _, pruned := range []bool{false, true} {
		if pruned {
			if _, err := p.l.PruneAudit(p.ctx, cutoff, pruner, nil); err != nil {
				t.Fatal(err)
			}
			p.ops("t1", 2)
		}
		log := p.log()
		if _, err := p.l.VerifyAuditChain(p.ctx, nil); err != nil {
			t.Fatalf("pruned %v: verify before the cut: %v", pruned, err)
		}
		// Each op's transition (numbered by its record) is followed by
		// the replay entry ops buffers: the newest entry is a replay.
		tail, transition := log[len(log)-1], log[len(log)-2]
		p.raw(ledger.AuditCollection, seqKey(tail.Seq), func([]byte) []byte { return nil })
		check(fmt.Sprintf("pruned %v, newest entry cut", pruned), transition.Seq,
			fmt.Sprintf("numbers audit entry %d, but the log ends at entry %d", tail.Seq, transition.Seq))
		p.raw(ledger.AuditCollection, seqKey(transition.Seq), func([]byte) []byte { return nil })
		p.raw(ledger.MetaCollection, []byte("audit_indexed"), func([]byte) []byte { return seqKey(transition.Seq - 1) })
		// The record numbers it, or (a journaling ledger) the index.
		check(fmt.Sprintf("pruned %v, transition cut and the watermark set back", pruned), transition.Seq-1,
			fmt.Sprintf("t1/%s numbers audit entry %d, but the log ends at entry %d", transition.Key, transition.Seq, transition.Seq-1))
		// Put them back for the next round.
		for _, e := range []ledger.AuditEntry{transition, tail} {
			v, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			p.raw(ledger.AuditCollection, seqKey(e.Seq), func([]byte) []byte { return v })
		}
		p.raw(ledger.MetaCollection, []byte("audit_indexed"), func([]byte) []byte { return seqKey(tail.Seq) })
	}
}

// pruneCheckpoint: a signed checkpoint of the head is held by the chain
// until the chain is cut below it or written again; after a prune, one
// of the anchor is still held, one of a pruned entry is left to its
// archive (ErrCheckpointPruned).
func pruneCheckpoint(t *testing.T, p *pruneEnv) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	p.ops("t1", 3)
	early := p.log()[1]
	cutoff := p.clock.Now()
	p.ops("t1", 2)
	log := p.log()
	head := log[len(log)-1]
	cp := ledger.SignAuditCheckpoint(key, "", head.Seq, head.Hash, p.clock.Now())
	if err := cp.VerifySignature(pub); err != nil {
		t.Fatalf("the signature of a checkpoint just signed: %v", err)
	}
	forged := cp
	forged.Entries--
	if err := forged.VerifySignature(pub); err == nil {
		t.Error("a checkpoint changed after signing verified")
	}
	if err := p.l.CheckAuditCheckpoint(p.ctx, cp); err != nil {
		t.Fatalf("the checkpoint of the head: %v", err)
	}
	pr, err := p.l.PruneAudit(p.ctx, cutoff, pruner, nil)
	if err != nil {
		t.Fatal(err)
	}
	anchor := ledger.SignAuditCheckpoint(key, "", pr.Anchor.Seq, pr.Anchor.Hash, p.clock.Now())
	if err := p.l.CheckAuditCheckpoint(p.ctx, anchor); err != nil {
		t.Errorf("the checkpoint of the anchor, after the prune: %v", err)
	}
	old := ledger.SignAuditCheckpoint(key, "", early.Seq, early.Hash, p.clock.Now())
	if err := p.l.CheckAuditCheckpoint(p.ctx, old); !errors.Is(err, ledger.ErrCheckpointPruned) {
		t.Errorf("the checkpoint of a pruned entry = %v; want ErrCheckpointPruned", err)
	}
	if err := p.l.CheckAuditCheckpoint(p.ctx, cp); err != nil {
		t.Errorf("the checkpoint of the head, after the prune: %v", err)
	}
	p.raw(ledger.AuditCollection, seqKey(head.Seq), func(v []byte) []byte {
		return bytes.Replace(v, []byte(`"hash":"`), []byte(`"hash":"0`), 1)
	})
	if err := p.l.CheckAuditCheckpoint(p.ctx, cp); err == nil || !strings.Contains(err.Error(), "written again") {
		t.Errorf("the checkpoint of an entry whose hash changed = %v; want it refused", err)
	}
	for seq := head.Seq; seq <= head.Seq+1; seq++ { // the head and the prune record after it
		p.raw(ledger.AuditCollection, seqKey(seq), func([]byte) []byte { return nil })
	}
	want := fmt.Sprintf("entries %d-%d were removed", head.Seq, head.Seq)
	if err := p.l.CheckAuditCheckpoint(p.ctx, cp); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("the checkpoint of a cut head = %v; want %q", err, want)
	}
}
