package mysql

// The statements the tests pin (their plans), under exported names for the
// external test package.
var (
	CandidatesSQL    = candidatesText
	CandidatesAllSQL = candidatesAllSQL
	ClaimSQL         = claimText
	ClaimUpdateSQL   = claimUpdateSQL
	LockSQL          = lockSQL
	PurgeSQL         = purgeSQL
	RedriveSQL       = redriveText
	RenewSQL         = renewSQL
	SettleSQL        = settleSQL
	TopicsSQL        = topicsSQL
)

// Cursor is a position in claim order, for CandidatesSQL.
type Cursor = claimCursor
