//go:build unix && !linux

package bolt

// doorbell is Linux's inotify watch of the wait file (doorbell_linux.go);
// elsewhere the holder polls the wait lock.
type doorbell struct{ rang chan struct{} }

func newDoorbell(path string) *doorbell { return nil }

func (b *doorbell) close() {}
