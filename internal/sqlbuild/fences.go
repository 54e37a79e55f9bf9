package sqlbuild

import (
	"context"

	"github.com/oncommit/oncommit/outbox"
)

// Fences runs a fenced settle or renewal statement whose rows are (id as
// text, attempts) and returns the fences it changed.
func Fences(ctx context.Context, db outbox.DB, q string, args ...any) ([]outbox.Fence, error) {
	rows, err := db.QueryDB(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outbox.Fence
	for rows.Next() {
		var id string
		var f outbox.Fence
		if err := rows.Scan(&id, &f.Attempts); err != nil {
			return nil, err
		}
		if f.ID, err = outbox.ParseID(id); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, rows.Err()
}
