#!/usr/bin/env bash
# 4 real agents x 4,000 workers through their store proxies, each worker one store barrier
# (bench/proxy_launch.py; its arguments pass on: --agents, --workers, --proxy on|off).
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n "$(ulimit -Hn)"
exec python3 bench/proxy_launch.py "$@"
