package sqlite

// The statements the tests pin (their texts and plans), under exported
// names for the external test package.
var (
	ClaimSQL       = claimText
	PromoteSQL     = promoteSQL
	PurgeSQL       = purgeSQL
	RedriveKeysSQL = redriveKeysSQL
	RunSQL         = runSQL
	RunSettleSQL   = runSettleSQL
	SkipHeadSQL    = skipHeadSQL
)
