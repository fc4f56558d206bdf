# Sourced by the benchmarks that measure against PyTorch: the anchor's interpreter and its
# torchrun. The anchor is torch 2.13 from the tests' environment (scripts/setup.sh --tests makes
# it; DLRUN_VENV moves it); PYTHON=/usr/bin/python3 measures against Debian's torch 1.13 instead.
# Sets python, torch_version and torchrun (an argv prefix); exits 2 when torch cannot be imported.
# Needs `here` (the bench folder) and `anchor_for` (the caller's name, for messages).
python=${PYTHON:-${DLRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dlrun/venv}/bin/python}
torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) || {
  echo "$anchor_for: $python cannot import torch (scripts/setup.sh --tests makes torch 2.13's" \
    "environment; PYTHON names another interpreter)" >&2
  exit 2
}
if [[ $torch_version == 1.* ]]; then
  # torch 1.13's torchrun fails on Python 3.11 without the repair in torchrun_py311.py.
  torchrun=("$python" "$here/torchrun_py311.py")
  torchrun_name="torchrun (torch $torch_version, through bench/torchrun_py311.py)"
else
  # The environment's own torchrun script: the benchmarks take the prefix as one argument list,
  # where `-m torch.distributed.run` would read as an option of theirs.
  torchrun=("$(dirname "$python")/torchrun")
  torchrun_name="torchrun (torch $torch_version)"
fi

# torch's TCPStore servers look every client's address up by name (a reverse DNS query at each
# accept). Where the machine's resolver is slow or unreachable, a query may wait out its 5 s
# timeout: the machine's cost, not torch's, and it turned a 1,024-client barrier into minutes.
# Where it may (root), a benchmark runs the launchers and servers of both sides under no_dns, in a
# mount namespace whose resolver (bench/resolv.conf) fails at once.
no_dns=()
if unshare --mount true 2>/dev/null; then
  no_dns=(unshare --mount sh -c 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
          "$here/resolv.conf")
fi
