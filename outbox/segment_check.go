package outbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// CheckSegments reads the segments of outboxDir (see SegmentSink) without
// changing or locking anything, and returns their problems, each one
// line: every damaged line (line and byte); an unterminated last line of
// the newest segment (a torn tail, which the next server to start cuts
// off and keeps aside); and every torn tail kept aside whose message is
// not in the segments — it was cut and never appended again, so if the
// ledger records it as delivered its line is lost, and the kept file is
// what is left of it (remove the file once it is dealt with). A kept
// tail whose message was appended again afterwards is no problem. It
// returns nothing when outboxDir has no segments. Run it with the
// servers stopped: a line being written can read as a torn tail.
// Errors: the file system's.
func CheckSegments(outboxDir string) ([]string, error) {
	dir := filepath.Join(outboxDir, "segments")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	seqs, err := segments(dir)
	if err != nil {
		return nil, fmt.Errorf("outbox segments: %w", err)
	}
	kept, err := filepath.Glob(filepath.Join(dir, "*.jsonl.torn-*"))
	if err != nil {
		return nil, err
	}
	found := map[string]bool{} // the kept tails' ids: appended again?
	keptID := make([]string, len(kept))
	for i, name := range kept {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		keptID[i] = tornID(f, 0)
		f.Close()
		found[keptID[i]] = false
	}
	var problems []string
	for i, seq := range seqs {
		p, err := checkSegment(filepath.Join(dir, segmentName(seq)), i == len(seqs)-1, found)
		if err != nil {
			return nil, err
		}
		problems = append(problems, p...)
	}
	for i, name := range kept {
		switch id := keptID[i]; {
		case id == "(unreadable)":
			problems = append(problems, fmt.Sprintf("%s: a torn tail cut off and kept aside, too short to name its message: if the ledger records a message as delivered whose line is not in the segments, this was it; remove the file once dealt with", name))
		case !found[id]:
			problems = append(problems, fmt.Sprintf("%s: the torn line of message %s, cut off and not appended again since: if the ledger records it as delivered, its line is lost and this file is what is left of it; remove the file once dealt with", name, id))
		}
	}
	return problems, nil
}

// checkSegment is CheckSegments' reading of one segment (newest: the
// newest one), marking in found the ids it holds that found has.
func checkSegment(path string, newest bool, found map[string]bool) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var problems []string
	line, lastBad := 0, int64(-1)
	end, err := scanSegment(io.NewSectionReader(f, 0, fi.Size()), true, func(_ int64, _ int, id string) {
		line++
		if _, ok := found[id]; ok {
			found[id] = true
		}
	}, func(off int64) bool {
		line++
		lastBad = off
		problems = append(problems, fmt.Sprintf("%s: line %d (byte %d) is damaged: not a message line (a JSON object with a message_id); a server refuses to start on it: repair or remove that line, keeping the lines after it", path, line, off))
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case end == fi.Size() || end == lastBad: // whole, or a line too long to read on
	case newest:
		problems = append(problems, fmt.Sprintf("%s: line %d (byte %d) is a torn tail, an unterminated last line (message %s): the next server to start cuts it off and keeps it aside; its message is appended again if it was not recorded as delivered", path, line+1, end, tornID(f, end)))
	default:
		problems = append(problems, fmt.Sprintf("%s: line %d (byte %d) is damaged: an unterminated last line in a segment that is not the newest", path, line+1, end))
	}
	return problems, nil
}
