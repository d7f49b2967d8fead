//go:build !unix

package outbox

import (
	"errors"
	"fmt"
)

// lockPath is not available here: the segment sink needs flock(2).
func lockPath(string) (func(), error) {
	return nil, fmt.Errorf("the segment outbox format needs flock(2), a Unix system: %w", errors.ErrUnsupported)
}
