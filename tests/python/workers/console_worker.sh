#!/bin/sh
# The worker of test_torchrun_console.py, run with --no-python under torchrun 2.13 and under dlrun:
# writes fixed lines to stdout and stderr, some holding the filter words `apple` (stdout and
# stderr) and `orange` (stderr).
#   CONSOLE_WORKER_OUT: a directory; worker_<LOCAL_RANK>.json gets this worker's pid and
#     TORCHELASTIC_RUN_ID (written to a temporary name, then renamed), before any output.
#   CONSOLE_WORKER_BYTES=1: also lines a console copy may rewrite: a carriage return inside a
#     line, a CRLF ending, bytes that are not UTF-8.
#   CONSOLE_WORKER_NONL=1: each stream ends with a line without its newline.
#   CONSOLE_WORKER_ERROR_FILE=1: writes {"written by": LOCAL_RANK} to TORCHELASTIC_ERROR_FILE
#     (exit status 0 all the same).
set -eu
r=$LOCAL_RANK
record="$CONSOLE_WORKER_OUT/worker_$r.json"
printf '{"pid": %s, "run_id": "%s", "local_rank": %s}\n' "$$" "$TORCHELASTIC_RUN_ID" "$r" \
  > "$record.tmp"
mv "$record.tmp" "$record"
if [ "${CONSOLE_WORKER_ERROR_FILE:-}" = 1 ]; then
  printf '{"written by": %s}\n' "$r" > "$TORCHELASTIC_ERROR_FILE"
fi
printf 'out 1 of rank %s apple\n' "$r"
printf 'err 1 of rank %s orange\n' "$r" >&2
printf '  spaces\ttab  of %s\n' "$r"
printf '\n'
printf 'err 2 of rank %s apple\n' "$r" >&2
printf 'err 3 %% $HOME ${rank} of %s orange apple\n' "$r" >&2
if [ "${CONSOLE_WORKER_BYTES:-}" = 1 ]; then
  printf 'cr a\rcr b of %s\n' "$r"
  printf 'crlf of %s\r\n' "$r"
  printf 'not utf-8 \377\376 of %s\n' "$r"
  printf 'err cr a\rerr cr b of %s\n' "$r" >&2
fi
printf 'out 3 of rank %s\n' "$r"
if [ "${CONSOLE_WORKER_NONL:-}" = 1 ]; then
  printf 'out without newline of %s' "$r"
  printf 'err without newline of %s' "$r" >&2
fi
