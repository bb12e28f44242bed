#!/usr/bin/env bash
# Alias of hack/gen-protos.sh (the name the issue uses).
exec "$(dirname "$0")/gen-protos.sh" "$@"
