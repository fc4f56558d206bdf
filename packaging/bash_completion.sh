#!/usr/bin/env bash
# Writes the bash completion of dlrun, dlrund and dlrun-train to OUTPUT: the flags each program
# lists in its --help (read at build time, so a new flag is completed without a list to keep in
# step), then the completion functions of TEMPLATE.
# Usage: bash_completion.sh OUTPUT TEMPLATE DLRUN DLRUND DLRUN_TRAIN
set -euo pipefail
output=$1 template=$2 dlrun=$3 dlrund=$4 train=$5

# "NAME KIND CHOICES" for each long flag of a CLI11 --help: KIND is "value" when CLI11 shows a
# type after the names (TEXT, INT, ...), else "flag"; CHOICES are the :{a,b} of a set check.
flags() {
  "$@" --help | awk '/^  -/ {
    kind = ($2 ~ /^(TEXT|INT|UINT|FLOAT|BOOLEAN|ENUM|CHAR)([:=]|$)/) ? "value" : "flag"
    choices = ""
    if (kind == "value" && match($2, /:\{[^}]*\}/)) {
      choices = substr($2, RSTART + 2, RLENGTH - 3)
      gsub(",", " ", choices)
    }
    n = split($1, names, ",")
    for (i = 1; i <= n; i++) {
      name = names[i]
      sub(/\{.*/, "", name)
      if (name ~ /^--/) print name, kind, choices
    }
  }'
}

{
  echo "# bash completion for dlrun, dlrund and dlrun-train. Generated from their --help by"
  echo "# packaging/bash_completion.sh; do not edit."
  echo "declare -gA _dlrun_flags=() _dlrun_valued=() _dlrun_choices=()"
  for context in dlrun status events stop dlrund train; do
    case $context in
      dlrun) program=("$dlrun") ;;
      dlrund) program=("$dlrund") ;;
      train) program=("$train") ;;
      *) program=("$dlrun" "$context") ;;
    esac
    all=() valued=()
    while read -r name kind choices; do
      all+=("$name")
      [ "$kind" = value ] && valued+=("$name")
      [ -n "$choices" ] && printf '_dlrun_choices[%q]=%q\n' "$context $name" "$choices"
    done < <(flags "${program[@]}")
    printf '_dlrun_flags[%s]=%q\n' "$context" "${all[*]}"
    printf '_dlrun_valued[%s]=%q\n' "$context" " ${valued[*]} "
  done
  cat "$template"
} > "$output.tmp"
mv "$output.tmp" "$output"
