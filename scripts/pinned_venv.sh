# Sourced by scripts/setup.sh and scripts/wheel.sh.
# pinned_venv DIR WHAT PIN...: makes the Python environment DIR with the packages PIN... (name==
# version), unless it has them already; WHAT names it in the one line said while it is made.
pinned_venv() {
  local dir=$1 what=$2
  shift 2
  "$dir/bin/python" -c 'import sys, importlib.metadata as m
sys.exit(any(m.version(p.split("==")[0]).split("+")[0] != p.split("==")[1] for p in sys.argv[1:]))' \
    "$@" 2>/dev/null && return
  echo "making $what in $dir ($*)"
  /usr/bin/python3 -m venv "$dir"
  "$dir/bin/python" -m pip install -q "$@"
}
