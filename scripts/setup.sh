#!/usr/bin/env bash
# Installs the Debian 12 packages that building and testing dlrun need (only those missing, so
# a second run installs nothing), then configures and builds into $DLRUN_BUILD_DIR (./build).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${DLRUN_BUILD_DIR:-$root/build}

packages=(
  cmake ninja-build g++ ccache          # toolchain
  libboost-dev libcli11-dev             # Asio, the command line
  nlohmann-json3-dev                    # TF_CONFIG, worker error files
  libgloo-dev libeigen3-dev zlib1g-dev  # the CPU trainer: all-reduce, math, gzip
  dataset-fashion-mnist                 # the trainer's data
  libgtest-dev                          # unit tests
  clang libclang-rt-14-dev              # libFuzzer for the wire-parser fuzz test
  python3-torch libtorch-dev            # real TCPStore clients (Python, C++), real DDP workers
  iproute2 util-linux                   # simulated hosts (scripts/netns.sh): ip, unshare, nsenter
  elfutils gdb                          # hang reports: eu-stack (else gdb) takes workers' stacks
  libslurm-dev slurm-wlm munge          # Slurm: libslurm's hostlists, a local cluster for tests
  # etcd v3 over gRPC: the C++ runtime, protoc and its gRPC plugin (proto/ is compiled at build
  # time), gRPC's own schemas, and a real etcd (3.4) with etcdctl for the tests; python3-etcd
  # (etcd's v2 API) for torchrun's etcd backend in bench/rdzv_bench.sh
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  etcd-server etcd-client python3-etcd
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

cmake -S "$root" -B "$build" -G Ninja
cmake --build "$build"
