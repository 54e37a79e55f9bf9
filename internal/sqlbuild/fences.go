package sqlbuild

import (
	"context"

	"github.com/oncommit/oncommit/outboxdriver"
)

// Fences runs a fenced settle or renewal statement whose rows are (id as
// text, attempts) and returns the fences it changed.
func Fences(ctx context.Context, db outboxdriver.DB, q string, args ...any) ([]outboxdriver.Fence, error) {
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outboxdriver.Fence
	for rows.Next() {
		var id string
		var f outboxdriver.Fence
		if err := rows.Scan(&id, &f.Attempts); err != nil {
			return nil, err
		}
		if f.ID, err = outboxdriver.ParseID(id); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, rows.Err()
}
