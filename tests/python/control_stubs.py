"""Python stubs of the control plane (proto/dlrun/v1/control.proto) and of grpc.health.v1,
generated at import time with grpc_tools into a temporary directory: a client nobody here
wrote (python3-grpcio, python3-grpc-tools). The test file removes STUB_DIR when it ends.
"""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "..", "proto")
# Debian's grpc-proto ships the standard schemas; python3-grpcio has no health module.
# Debian 12's grpc-proto; Debian 13 has none, and golang-google-grpc-dev carries the same file.
HEALTH_PROTOS = (
    "/usr/share/grpc-proto/grpc/health/v1/health.proto",
    "/usr/share/gocode/src/google.golang.org/grpc/debian/missing-sources/grpc/"
    "grpc-proto/master/grpc/health/v1/health.proto",
)
HEALTH_PROTO = next((p for p in HEALTH_PROTOS if os.path.exists(p)), HEALTH_PROTOS[0])


def generate_stubs():
    """Compiles control.proto and health.proto into a temporary directory and imports them."""
    out = tempfile.mkdtemp(prefix="dlrun-stubs-")
    # health.proto is compiled from a copy at the top level: its own path (grpc/health/v1)
    # would make a Python package `grpc` that hides grpcio's.
    shutil.copy(HEALTH_PROTO, os.path.join(out, "health.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{out}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "dlrun/v1/control.proto",
            "health.proto",
        ],
        check=True,
    )
    sys.path.insert(0, out)
    modules = [
        importlib.import_module(name)
        for name in (
            "dlrun.v1.control_pb2",
            "dlrun.v1.control_pb2_grpc",
            "health_pb2",
            "health_pb2_grpc",
        )
    ]
    return out, modules


STUB_DIR, (pb, pb_grpc, health_pb, health_grpc) = generate_stubs()
