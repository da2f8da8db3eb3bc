#!/bin/sh
# Every worker process needs its own, non-blank id: it is written into the
# lease_owner of each job it holds. Replicas of a scaled compose service share
# one environment, so unless the id is set explicitly each takes its container's
# hostname, which Docker makes unique per container.
set -eu

if [ -z "${WFJOBS_WORKER_ID:-}" ]; then
    WFJOBS_WORKER_ID="${WFJOBS_WORKER_ID_PREFIX:-worker}-$(hostname)"
    export WFJOBS_WORKER_ID
fi

exec "$@"
