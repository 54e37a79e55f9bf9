package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Match them with [errors.Is]; errors.As still finds the
// driver's error (such as *pgconn.PgError) they wrap.
var (
	// ErrInvalidMessage is wrapped by every [*MessageError].
	ErrInvalidMessage = errors.New("outbox: invalid message")
)

// prefix starts the text of every error the outbox returns, once.
const prefix = "outbox: "

// opError is an error of one operation ("publish", "claim"...): its text
// is "outbox: op: ", the context's error when the context ended, and the
// text of err without err's own "outbox: ", so the prefix is said once
// however the errors nest.
type opError struct {
	op     string
	ctxErr error // context.DeadlineExceeded or context.Canceled, or nil
	err    error
}

func (e *opError) Error() string {
	s := prefix + e.op + ": "
	if e.ctxErr != nil {
		s += e.ctxErr.Error() + ": "
	}
	return s + strings.TrimPrefix(e.err.Error(), prefix)
}

func (e *opError) Unwrap() []error {
	if e.ctxErr == nil {
		return []error{e.err}
	}
	return []error{e.ctxErr, e.err}
}

// wrapOp returns err as an error of operation op. When ctx has ended and
// err does not say so, the error also wraps ctx's error, so callers can
// test errors.Is(err, context.DeadlineExceeded).
func wrapOp(ctx context.Context, op string, err error) error {
	e := &opError{op: op, err: err}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		e.ctxErr = cerr
	}
	return e
}

// MessageError reports a message that Publish refused before sending any SQL.
// It wraps [ErrInvalidMessage].
type MessageError struct {
	// Index is the position of the message in the batch (0 for Publish), or
	// -1 when the batch as a whole is refused (too many messages).
	Index int
	// Field names the offending field of [Message], such as "Topic".
	Field string
	// Reason says what is wrong, in lower case.
	Reason string
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox: invalid message %d: %s: %s", e.Index, e.Field, e.Reason)
}

// Unwrap returns [ErrInvalidMessage].
func (e *MessageError) Unwrap() error { return ErrInvalidMessage }
