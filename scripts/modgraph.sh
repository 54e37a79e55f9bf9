#!/usr/bin/env bash
# Measures what a service pays for importing oncommit, against the layout a
# release would publish (issue 13): builds a file-based module proxy of this
# repository's modules at v0.1.0 (scripts/modproxy), then, each in a fresh
# module cache (GOPROXY: that proxy, then proxy.golang.org for the rest):
#   1. a service importing outbox, dialect/postgres, adapters/sqltx and
#      adapters/pgxtx: `go mod tidy`; counts the module zips downloaded, the
#      size of the module cache, and checks `go list -m all` holds no docker,
#      dockertest, sqlite or mysql module, and no OpenTelemetry module
#      (go.opentelemetry.io: only the otel module brings it);
#   2. the same service without oncommit (pgx and sqlmock), for reference;
#   3. a SQLite-only program (outbox, dialect/sqlite, adapters/sqltx): its
#      binary must link no pgx (`go version -m`);
#   4. a program importing the otel module: it builds from the proxy, and
#      its graph does hold go.opentelemetry.io (so check 1 can see one).
# Fails when (1) downloads more than 15 zips or 60 MB, or when a check fails.
# Usage: scripts/modgraph.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
version=v0.1.0
go run ./scripts/modproxy -repo "$repo" -version "$version" -out "$work/proxy" >/dev/null

export GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=github.com/oncommit GONOSUMCHECK=github.com/oncommit GOPRIVATE= GONOPROXY=
export GOPROXY="file://$work/proxy,https://proxy.golang.org"
export GOSUMDB=sum.golang.org

# fresh NAME: a new module in $work/NAME with its own module cache.
fresh() {
	mkdir -p "$work/$1"
	export GOMODCACHE="$work/$1.cache"
	cd "$work/$1"
	go mod init "example.com/$1" >/dev/null 2>&1
}
zips() { find "$GOMODCACHE/cache/download" -name '*.zip' | wc -l; }
megabytes() { du -sm "$GOMODCACHE" | cut -f1; }

fresh service
cat > main.go <<'GO'
package main

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/oncommit/oncommit/adapters/pgxtx"
	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
)

func main() {
	ob, _ := outbox.New(postgres.Dialect(), outbox.Config{})
	pool, _ := pgxpool.New(context.Background(), "")
	_, _ = ob.Relay(pgxtx.FromPool(pool), outbox.RelayConfig{})
	var db *sql.DB
	_, _ = ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{})
}
GO
cat > main_test.go <<'GO'
package main

import (
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
)

func TestMock(t *testing.T) { _, _, _ = sqlmock.New() }
GO
go get "github.com/oncommit/oncommit@$version" >/dev/null 2>&1
go mod tidy >/dev/null 2>&1
svc_mods=$(go list -m all | wc -l)
svc_zips=$(zips)
svc_mb=$(megabytes)
heavy=$(go list -m all | grep -Ei 'docker|dockertest|sqlite|mysql' || true)
otel_mods=$(go list -m all | grep -E '^go\.opentelemetry\.io/' || true)
go build -o /dev/null . 

fresh baseline
cat > main.go <<'GO'
package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

func main() { _, _ = pgxpool.New(context.Background(), "") }
GO
cp "$work/service/main_test.go" .
go mod tidy >/dev/null 2>&1
base_mods=$(go list -m all | wc -l)
base_zips=$(zips)
base_mb=$(megabytes)

fresh sqliteonly
cat > main.go <<'GO'
package main

import (
	"database/sql"

	"github.com/oncommit/oncommit/adapters/sqltx"
	"github.com/oncommit/oncommit/dialect/sqlite"
	"github.com/oncommit/oncommit/outbox"
	_ "modernc.org/sqlite"
)

func main() {
	db, _ := sql.Open("sqlite", "file::memory:")
	ob, _ := outbox.New(sqlite.Dialect(), outbox.Config{})
	_, _ = ob.Relay(sqltx.FromDB(db), outbox.RelayConfig{})
}
GO
go get "github.com/oncommit/oncommit/dialect/sqlite@$version" >/dev/null 2>&1
go mod tidy >/dev/null 2>&1
go build -o sqliteonly .
pgx_linked=$(go version -m sqliteonly | grep -c 'jackc/pgx' || true)

fresh otelsvc
cat > main.go <<'GO'
package main

import (
	"github.com/oncommit/oncommit/dialect/postgres"
	"github.com/oncommit/oncommit/outbox"
	oncommitotel "github.com/oncommit/oncommit/otel"
)

func main() {
	tel, _ := oncommitotel.New(oncommitotel.Config{})
	_, _ = outbox.New(postgres.Dialect(), outbox.Config{Hook: tel})
}
GO
go get "github.com/oncommit/oncommit/otel@$version" >/dev/null 2>&1
go mod tidy >/dev/null 2>&1
go build -o /dev/null .
otel_seen=$(go list -m all | grep -c '^go\.opentelemetry\.io/otel ' || true)

printf '%-52s %14s %14s %10s\n' "" "go list -m all" "zips" "cache MB"
printf '%-52s %14s %14s %10s\n' "service without oncommit (pgx + sqlmock)" "$base_mods" "$base_zips" "$base_mb"
printf '%-52s %14s %14s %10s\n' "with oncommit (outbox, postgres, sqltx, pgxtx)" "$svc_mods" "$svc_zips" "$svc_mb"
echo "heavy modules in the service's graph: ${heavy:-none}"
echo "OpenTelemetry modules in the service's graph: ${otel_mods:-none}"
echo "pgx modules linked into a SQLite-only binary: $pgx_linked"
echo "go.opentelemetry.io/otel in the graph of a program importing the otel module: $otel_seen"

fail=0
[ "$svc_zips" -le 15 ] || { echo "FAIL: $svc_zips module zips, want at most 15"; fail=1; }
[ "$svc_mb" -le 60 ] || { echo "FAIL: $svc_mb MB of module cache, want at most 60"; fail=1; }
[ -z "$heavy" ] || { echo "FAIL: heavy modules in the graph"; fail=1; }
[ -z "$otel_mods" ] || { echo "FAIL: OpenTelemetry modules in a core-only service's graph"; fail=1; }
[ "$pgx_linked" -eq 0 ] || { echo "FAIL: a SQLite-only binary links pgx"; fail=1; }
[ "$otel_seen" -eq 1 ] || { echo "FAIL: the otel module's user has no go.opentelemetry.io/otel in its graph"; fail=1; }
exit $fail
