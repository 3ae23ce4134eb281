#!/usr/bin/env bash
# Runs "$@" as if on one of two hosts: ranks below half the world on "nodeA", the others on
# "nodeB", each in a UTS namespace of its own (unshare --uts: root, or user namespaces). They
# still share this machine's /dev/shm and loopback, which the sim and the collector need; what
# differs is the host identity every trace, verdict and liveness check goes by.
half=$((${WORLD_SIZE:-2} / 2))
if [ "${RANK:-0}" -lt "$half" ]; then host=nodeA; else host=nodeB; fi
exec unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
