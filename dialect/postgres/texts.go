package postgres

import "github.com/oncommit/oncommit/internal/pgsql"

// The repository's tests and benchmarks reach the statements through
// internal/pgsql, so that this package exports none of them.
func init() {
	pgsql.QuoteTable = quoteTable
	pgsql.Channel = channel
	pgsql.ClaimSQL = claimText
	pgsql.ClaimSettleSQL = claimSettleText
	pgsql.RenewSQL = renewSQL
	pgsql.SettleSQL = settleSQL
	pgsql.PurgeSQL = purgeSQL
	pgsql.ListSQL = listSQL
	pgsql.CountSQL = countSQL
	pgsql.ActSQL = actSQL
	pgsql.DeadOrderedSQL = deadOrderedSQL
	pgsql.OrderedClaimSQL = orderedClaimSQL
	pgsql.SettleRunsSQL = settleRunsSQL
	pgsql.RedriveOrderedIDsSQL = redriveOrderedIDsSQL
	pgsql.SkipHeadSQL = skipHeadSQL
}
