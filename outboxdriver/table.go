package outboxdriver

import (
	"regexp"
	"strconv"
	"strings"
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ParseTable validates a table name of the form "name" or "schema.name".
func ParseTable(s string) (Table, error) {
	schema, name, qualified := strings.Cut(s, ".")
	if !qualified {
		schema, name = "", s
	}
	if (qualified && !identRE.MatchString(schema)) || !identRE.MatchString(name) {
		return Table{}, &ConfigError{"Table", strconv.Quote(s) + " is not name or schema.name made of lower-case identifiers ([a-z_][a-z0-9_]*, at most 63 bytes each)"}
	}
	return Table{Schema: schema, Name: name}, nil
}

// DefaultTable is the outbox table's name when none is given.
const DefaultTable = "outbox"

// DefaultInboxTable is the inbox table's name when none is given.
const DefaultInboxTable = "inbox"
