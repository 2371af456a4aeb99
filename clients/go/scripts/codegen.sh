#!/usr/bin/env bash
# Regenerates respcoordv1/ from proto/ (no system protoc: the pinned pure-Go
# toolchain in tools/go.mod). `--check` writes nothing and fails when the
# committed code differs from what the proto generates now.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
check=()
[[ "${1:-}" == --check ]] && check=(-check)
cd "$here/tools"
go run ./cmd/protogen -proto "$here/../../proto" -out "$here" "${check[@]}"
