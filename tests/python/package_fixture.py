"""What the installation tests share: the build directory ctest names (DLRUN_BUILD_DIR), its
install into a temporary prefix, its Debian package, and commands run with a deadline.

Every command's output is kept and shown when it fails, so a failed install or cpack says why."""

import glob
import os
import subprocess
import tempfile

COMMAND_TIMEOUT_S = 300  # the longest one install, cpack or lintian run may take


def build_dir():
    path = os.environ.get("DLRUN_BUILD_DIR")
    if not path or not os.path.isfile(os.path.join(path, "CMakeCache.txt")):
        raise RuntimeError(f"DLRUN_BUILD_DIR must name a configured build (got {path!r})")
    return path


def class_temp_dir(cls):
    """A temporary directory for a test class's setUpClass, removed after its last test."""
    d = tempfile.TemporaryDirectory(prefix="dlrun-test-")
    cls.addClassCleanup(d.cleanup)
    return d.name


def run(args, timeout=COMMAND_TIMEOUT_S, **kwargs):
    """Runs args to completion and returns their output; an exit other than 0 fails the test
    (AssertionError, also from setUpClass) with that output."""
    result = subprocess.run(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, **kwargs
    )
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}:\n{result.stdout[-6000:]}"
        )
    return result.stdout


def install(prefix):
    """cmake --install of the build into prefix."""
    run(["cmake", "--install", build_dir(), "--prefix", prefix])
    return prefix


def make_packages(out):
    """cpack -G DEB from the build, into out; returns {package name: path}: dlrun, and from a
    build with CUDA the add-on dlrun-cuda too (packaging/CMakeLists.txt)."""
    run(
        [
            "cpack",
            "-G",
            "DEB",
            "--config",
            os.path.join(build_dir(), "CPackConfig.cmake"),
            "-B",
            out,
        ]
    )
    packages = {
        os.path.basename(path).split("_")[0]: path for path in glob.glob(os.path.join(out, "*.deb"))
    }
    expected = {"dlrun", "dlrun-cuda"} if with_cuda() else {"dlrun"}
    if set(packages) != expected:
        raise AssertionError(f"cpack made {sorted(packages.values())}, not {sorted(expected)}")
    return packages


def with_cuda():
    """Whether the build has the trainer's CUDA engine, the module dlrun-train-cuda.so."""
    return os.path.isfile(os.path.join(build_dir(), "bin", "dlrun-train-cuda.so"))


def long_flags(help_text):
    """The long flags (with dashes) that a CLI11 --help lists."""
    flags = []
    for line in help_text.splitlines():
        if line.startswith("  -"):
            flags += [
                name.split("{")[0] for name in line.split()[0].split(",") if name.startswith("--")
            ]
    return flags
