#!/usr/bin/env bash
# Runs the C consumer's comm checks (examples/c_consumer) as 2 ranks on one
# machine, rendezvousing through a file store; fails unless both pass.
#   scripts/c-consumer-comm.sh CONSUMER [--plugin PATH | --torch-release R --plugin-dir D]
set -uo pipefail
consumer=${1:?usage: scripts/c-consumer-comm.sh CONSUMER [plugin options]}
shift
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
timeout 120 "$consumer" comm --rank 0 --world 2 --rendezvous "file://$store/store" "$@" &
first=$!
timeout 120 "$consumer" comm --rank 1 --world 2 --rendezvous "file://$store/store" "$@"
second=$?
wait "$first"
first=$?
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
