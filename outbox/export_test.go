package outbox

// CheckJSON exposes checkJSON to the external tests.
var CheckJSON = checkJSON
