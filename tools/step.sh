#!/usr/bin/env bash
# step.sh TITLE CMD...: print "==> TITLE", run CMD, then its duration (make's progress lines).
# A failing CMD prints how long it ran and exits with its status.
set -u
title=$1
shift
printf '\n==> %s\n' "$title"
start=$(date +%s)
"$@"
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ]; then
  printf '==> FAILED after %ss (exit %s): %s\n' "$took" "$rc" "$title" >&2
  exit $rc
fi
printf '==> done in %ss: %s\n' "$took" "$title"
