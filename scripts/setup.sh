#!/usr/bin/env bash
# setup.sh [--tests] [TARGET...]: installs the Debian 12 or 13 packages that building dlrun and
# running its main job need (only those missing, so a second run installs nothing), then
# configures and builds TARGETs (all when none is named) into $DLRUN_BUILD_DIR (./build).
# With --tests it also installs what the tests need and makes the Python environment of their
# newer era (below).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}
# torch 2.13 and TensorFlow for the tests (the main job needs neither), pinned: an unpinned torch
# would pull a CUDA build of several GB; and the one clang-format and ruff the tree is formatted
# and linted with (scripts/format.py), the same on Debian 12 and 13. Made once, reused while its pins are met.
venv=${DLRUN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dlrun/venv}
venv_pins=(torch==2.13.0 tensorflow-cpu==2.21.0 clang-format==14.0.6 ruff==0.17.6
           lightning==2.6.6 transformers==5.24.0 accelerate==1.15.0)  # dlrun.progress's callbacks
tests=false
if [ "${1:-}" = --tests ]; then
  tests=true
  shift
fi
targets=("$@")

# Building and the main job (the bundled trainer on Fashion-MNIST).
packages=(
  cmake ninja-build g++ ccache pkgconf  # toolchain
  libboost-dev libcli11-dev             # Asio, the command line
  nlohmann-json3-dev                    # TF_CONFIG, worker error files
  libgloo-dev libeigen3-dev zlib1g-dev  # the CPU trainer: all-reduce, math, gzip
  dataset-fashion-mnist                 # the trainer's data
  libgtest-dev                          # unit tests (configuring needs it)
  libslurm-dev                          # libslurm's hostlists, opened at run time (tests compare)
  # etcd v3 over gRPC: the C++ runtime, protoc and its gRPC plugin (proto/ is compiled at build
  # time)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
)
# gRPC's own schemas (grpc.health.v1) for the control plane's tests: Debian 13 has no
# grpc-proto, and golang-google-grpc-dev carries the same files (under /usr/share/gocode).
release=$(. /etc/os-release && echo "${VERSION_ID:-}")
case $release in
  12) grpc_schemas=grpc-proto ;;
  13) grpc_schemas=golang-google-grpc-dev ;;
  *) echo "setup: Debian 12 or 13 expected, not '${release:-unknown}': using 13's packages" >&2
     grpc_schemas=golang-google-grpc-dev ;;
esac
$tests && packages+=(
  clang libclang-rt-dev                 # libFuzzer for the wire-parser fuzz test
  python3-torch libtorch-dev            # real TCPStore clients (Python, C++), real DDP workers
  python3-venv                          # the tests' torch 2.13 and TensorFlow (--tests)
  iproute2 util-linux                   # simulated hosts (scripts/netns.sh): ip, unshare, nsenter
  tmux                                  # dlrun top in a terminal of its own (test_job_view.py)
  elfutils gdb                          # hang reports: eu-stack (else gdb) takes workers' stacks
  slurm-wlm munge                       # a local Slurm cluster
  # a real etcd (3.4 on Debian 12, 3.5 on 13) with etcdctl; python3-etcd (etcd's v2 API) for
  # torchrun's etcd backend in bench/rdzv_bench.sh
  "$grpc_schemas" etcd-server etcd-client python3-etcd
  python3-grpcio python3-grpc-tools     # the control plane's tests: a gRPC client not ours
  openssh-client openssh-server         # dlrun --hostfile: ssh, and real servers in its tests
  openmpi-bin                           # dlrun under mpirun, in the same tests
  # watching a job (--metrics-port, --metrics-file): a real Prometheus and promtool, a headless
  # browser for the page, matplotlib for scripts/plot_metrics.py
  prometheus chromium chromium-driver python3-selenium python3-matplotlib
  # installing (packaging/): man pages from --help, the package's Depends (dpkg-shlibdeps),
  # its checks (lintian, a fresh Debian root), the service's (systemd-analyze), man itself
  help2man dpkg-dev lintian debootstrap systemd man-db
)
if [ "${DLRUN_SETUP_PRINT:-}" = packages ]; then  # for test_quickstart_releases.py
  echo "${packages[*]}"
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

. "$root/scripts/pinned_venv.sh"
if $tests; then
  pinned_venv "$venv" "the tests' Python environment" "${venv_pins[@]}"
  # The Kubernetes operators' published API schemas (their own Python SDKs) and a validator, for
  # the manifests of docs/guides/kubernetes.md (tests/python/test_kubernetes_manifests.py).
  pinned_venv "${DLRUN_SCHEMA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dlrun/k8s-schemas}" \
    "the operators' schemas" kubeflow-trainer-api==2.3.0 kubeflow-training==1.9.4 \
    kubernetes==35.0.0 jsonschema==4.26.0 PyYAML==6.0.4
fi

# The wheel's packing tools (scripts/wheel.sh), so its test fetches nothing.
$tests && bash "$root/scripts/wheel.sh" --tools

cmake -S "$root" -B "$build" -G Ninja -DDLRUN_TORCH2_PYTHON="$venv/bin/python"
cmake --build "$build" ${targets[@]:+--target "${targets[@]}"}
