// Package oerr builds the classified errors dialects return: a driver's
// error that also wraps one or more outbox sentinels.
package oerr

// Wrap returns err classified as the sentinels: its text is the first
// sentinel's, then err's; errors.Is finds every sentinel and errors.As
// still finds the driver's error type.
func Wrap(err error, sentinels ...error) error {
	return &classified{err: err, sentinels: sentinels}
}

type classified struct {
	err       error
	sentinels []error
}

func (c *classified) Error() string { return c.sentinels[0].Error() + ": " + c.err.Error() }

func (c *classified) Unwrap() []error { return append(append([]error(nil), c.sentinels...), c.err) }
