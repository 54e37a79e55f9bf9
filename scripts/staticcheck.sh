#!/usr/bin/env bash
# scripts/staticcheck.sh runs staticcheck on every module of the workspace
# (`go list -m` lists them from go.work; without a go.work, the root module
# alone), in one run, so packages that several modules share are checked
# once. Exit status: staticcheck's (0 when clean).
#
#   bash scripts/staticcheck.sh
#
# STATICCHECK overrides the pinned version
# (e.g. STATICCHECK=honnef.co/go/tools/cmd/staticcheck@latest).
set -euo pipefail

STATICCHECK=${STATICCHECK:-honnef.co/go/tools/cmd/staticcheck@v0.8.2}

cd "$(git rev-parse --show-toplevel)"
mapfile -t patterns < <(go list -m -f '{{.Dir}}/...')
echo "staticcheck ($STATICCHECK) on ${#patterns[@]} module(s)"
go run "$STATICCHECK" "${patterns[@]}"
