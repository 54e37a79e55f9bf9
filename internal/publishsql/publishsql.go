// Package publishsql hands the outboxtest kit the statements Publish sends
// besides the one outbox.Outbox.PublishSQL returns, so that it can expect
// them under sqlmock; no user calls them. Package outbox fills Of in when it
// is imported (its init).
package publishsql

import "github.com/oncommit/oncommit/outboxdriver"

// Extra are the statements Publish may send besides Statement.Query.
type Extra struct {
	// QuietQuery, when not empty, is the statement Publish sends instead
	// of Query, with the same Args, when Config.NotifyInterval has
	// coalesced the publish's notification away: Query without the NOTIFY.
	QuietQuery string
	// StoredQuery and StoredArgs, when StoredQuery is not empty, are sent
	// after Query on dialects that implement outboxdriver.StoredLister
	// (MySQL) when a message has a DedupKey: they return the ids stored.
	StoredQuery string
	StoredArgs  []any
	// Sequence, with Config.OrderByKey, are the statements that number
	// the ordered messages stored, sent last when an ordered message has a
	// DedupKey, or always on an outboxdriver.Sequencer (MySQL); a publish
	// with duplicates numbers only the others.
	Sequence []outboxdriver.Statement
}

// Of returns the Extra of an outbox.Statement (a value, not a pointer).
var Of func(statement any) Extra
