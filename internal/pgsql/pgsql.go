// Package pgsql names the SQL texts of dialect/postgres for this
// repository's own tests and benchmarks, which pin their plans and time
// them; the dialect's package exports none of them. The dialect fills the
// functions in when it is imported (its init): import
// github.com/oncommit/oncommit/dialect/postgres beside this package.
package pgsql

import "github.com/oncommit/oncommit/outboxdriver"

// AllTopics, as the topics of ClaimSQL, ClaimSettleSQL and OrderedClaimSQL,
// claims every topic.
const AllTopics = -1

// The statements, as dialect/postgres builds them; see its sources for
// their parameters.
var (
	QuoteTable           func(t outboxdriver.Table) string
	Channel              func(t outboxdriver.Table) string
	ClaimSQL             func(t outboxdriver.Table, topics int) string
	ClaimSettleSQL       func(t outboxdriver.Table, topics int, keep bool) string
	RenewSQL             func(t outboxdriver.Table) string
	SettleSQL            func(t outboxdriver.Table) (deleteDone, markDelivered, retry, markDead, deleteDead string)
	PurgeSQL             func(t outboxdriver.Table) string
	ListSQL              func(t outboxdriver.Table, f outboxdriver.Filter, limit int, withPayload bool) (string, []any)
	CountSQL             func(t outboxdriver.Table, f outboxdriver.Filter) (string, []any)
	ActSQL               func(t outboxdriver.Table, a outboxdriver.Action, f outboxdriver.Filter) (string, []any)
	DeadOrderedSQL       func(t outboxdriver.Table, f outboxdriver.Filter) (string, []any)
	OrderedClaimSQL      func(t outboxdriver.Table, topics int, keep bool) string
	SettleRunsSQL        func(t outboxdriver.Table, keep bool) string
	RedriveOrderedIDsSQL func(t outboxdriver.Table) string
	SkipHeadSQL          func(t outboxdriver.Table) string
)
