#!/usr/bin/env python3
"""Packs dlrun's wheel from an installed tree (scripts/wheel.sh makes that tree with cmake
--install --strip and runs this with auditwheel and patchelf at hand).

    wheel.py PREFIX DIST

The wheel installs the same tree into a Python environment's prefix as cmake --install does into
its prefix (bin/, libexec/dlrun/, lib/dlrun/, share/dlrun/, share/man/): the programs find their
files from their own path, so they run from a venv as from /usr. The programs go in the wheel's
.data/scripts (pip puts them on the environment's PATH, as they are: no Python in front of every
agent's start), the rest in .data/data, and the Python package `dlrun` (the progress API, `python
-m dlrun`) at the root. The shared libraries a bare manylinux system lacks (Gloo and what it
needs, OpenSSL for dlrun-tls) are copied into lib/dlrun/libs and found there through each
program's RUNPATH; libslurm is never among them (dlrun opens the node's own). NVIDIA's libraries
stay outside, as for the Debian package: the CUDA module needs them on the node. The platform tag
is the one `auditwheel show` finds the wheel consistent with (the CUDA module, which needs
libraries no manylinux system has, left out of that look). Prints the wheel's path, its size and
what auditwheel said; fails over SIZE_BUDGET_MB."""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

# docs/guides/install.md: 17.6 MB built on Debian 12, where gRPC, protobuf and Abseil are linked
# into each program; 23.4 MB on Debian 13, whose gRPC and Abseil come as shared libraries only,
# bundled once each. A budget for both, which a new bulky dependency still trips.
SIZE_BUDGET_MB = 25
SCRIPTS = ("dlrun", "dlrund", "dlrun-train")
DATA_DIRS = ("libexec/dlrun", "lib/dlrun", "share/dlrun", "share/man")
PYTHON_PACKAGE = "share/dlrun/python/dlrun"
LIBS_DIR = "lib/dlrun/libs"
# What every manylinux system has (auditwheel's list for manylinux_2_36, which the programs
# need: glibc 2.36), so it is never bundled.
SYSTEM_LIBS = re.compile(
    r"^(ld-linux-x86-64|libc|libm|libmvec|libdl|librt|libpthread|libresolv|"
    r"libutil|libanl|libnsl|libgcc_s|libstdc\+\+|libatomic|libz|libexpat)"
    r"\.so(\.\d+)*$"
)
NVIDIA_LIBS = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvJitLink)\.so")
CUDA_MODULE = "lib/dlrun/trainer/dlrun-train-cuda.so"
SUMMARY = "Launches distributed training jobs as torchrun does, faster and sturdier"
TIMESTAMP = (2020, 1, 1, 0, 0, 0)  # every entry's: the same tree packs into the same wheel


def run(args):
    result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise SystemExit(f"wheel: {' '.join(args)} exited {result.returncode}:\n{result.stdout}")
    return result.stdout


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def linked_libs(path):
    """{soname: path} of what path loads (ldd: the whole closure), less the system's."""
    libs = {}
    for line in run(["ldd", path]).splitlines():
        match = re.match(r"\s*(\S+) => (\S+)", line)
        if not match:
            continue
        name, found = match.groups()
        if found == "not":
            raise SystemExit(f"wheel: {path} needs {name}, which this machine lacks")
        if not SYSTEM_LIBS.match(name) and not NVIDIA_LIBS.match(name):
            libs[name] = found
    return libs


def layout(prefix):
    """{path in the wheel: path in prefix}."""
    version = re.match(r"dlrun (\S+)", run([os.path.join(prefix, "bin", "dlrun"), "--version"]))
    data = f"dlrun-{version.group(1)}.data"
    files = {f"{data}/scripts/{name}": os.path.join(prefix, "bin", name) for name in SCRIPTS}
    for top in DATA_DIRS:
        for folder, _, names in os.walk(os.path.join(prefix, top)):
            for name in names:
                source = os.path.join(folder, name)
                files[f"{data}/data/{os.path.relpath(source, prefix)}"] = source
    package = os.path.join(prefix, PYTHON_PACKAGE)
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            files[f"dlrun/{name}"] = os.path.join(package, name)
    return version.group(1), data, files


def bundle(files, data, work):
    """Copies the libraries the ELF files load and a bare system lacks into LIBS_DIR and points
    each file's RUNPATH there: relative to where pip installs it, and for the programs also
    relative to their place inside the wheel, where auditwheel looks."""
    libs = {}
    for inside, source in sorted(files.items()):
        if not is_elf(source):
            continue
        needed = linked_libs(source)
        libs.update(needed)
        if not needed:
            continue
        patched = os.path.join(work, inside)
        os.makedirs(os.path.dirname(patched), exist_ok=True)
        shutil.copy2(source, patched)
        installed = (
            f"bin/{os.path.basename(inside)}"
            if "/scripts/" in inside
            else inside.split("/data/", 1)[1]
        )
        runpath = ["$ORIGIN/" + os.path.relpath(LIBS_DIR, os.path.dirname(installed))]
        if "/scripts/" in inside:
            runpath.append(f"$ORIGIN/../data/{LIBS_DIR}")
        run(["patchelf", "--set-rpath", ":".join(runpath), patched])
        files[inside] = patched
    for name, source in sorted(libs.items()):
        copied = os.path.join(work, "libs", name)
        os.makedirs(os.path.dirname(copied), exist_ok=True)
        shutil.copy(source, copied)
        os.chmod(copied, 0o755)
        run(["patchelf", "--set-rpath", "$ORIGIN", copied])
        files[f"{data}/data/{LIBS_DIR}/{name}"] = copied
    return sorted(libs)


def metadata(version, tag):
    return {
        "METADATA": (
            f"Metadata-Version: 2.1\nName: dlrun\nVersion: {version}\n"
            f"Summary: {SUMMARY}\nRequires-Python: >=3.8\n"
            "Classifier: Programming Language :: C++\n"
            "Classifier: Operating System :: POSIX :: Linux\n"
            "Description-Content-Type: text/markdown\n\n"
            "dlrun starts N workers per node with the environment PyTorch and TensorFlow"
            " read, as torchrun does, and keeps them running: elastic rendezvous, restarts"
            " after failures, Slurm, hang reports, a control plane and a live page.\n\n"
            "    pip install dlrun\n"
            "    dlrun --standalone --nproc-per-node=4 train.py\n"
        ),
        "WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: dlrun scripts/wheel.py\n"
            f"Root-Is-Purelib: false\nTag: {tag}\n"
        ),
    }


def pack(path, files, version, tag):
    """Writes the wheel: files ({inside: source}), then the dist-info with its RECORD."""
    info = f"dlrun-{version}.dist-info"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as wheel:

        def add(inside, data, mode):
            entry = zipfile.ZipInfo(inside, TIMESTAMP)
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{inside},sha256={digest.decode()},{len(data)}")

        for inside, source in sorted(files.items()):
            with open(source, "rb") as f:
                add(inside, f.read(), 0o755 if os.access(source, os.X_OK) else 0o644)
        for name, text in metadata(version, tag).items():
            add(f"{info}/{name}", text.encode(), 0o644)
        record.append(f"{info}/RECORD,,")
        add_record = zipfile.ZipInfo(f"{info}/RECORD", TIMESTAMP)
        add_record.external_attr = (0o100644) << 16
        wheel.writestr(add_record, "\n".join(record) + "\n", zipfile.ZIP_DEFLATED)


def platform_tag(wheel):
    """The tag `auditwheel show` finds wheel consistent with, and its whole answer."""
    said = run(["auditwheel", "show", wheel])
    match = re.search(r'consistent with the\s+following\s+platform\s+tag:\s+"([^"]+)"', said)
    if not match:
        raise SystemExit(f"wheel: auditwheel show gave no platform tag:\n{said}")
    return match.group(1), said


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: wheel.py PREFIX DIST")
    prefix, dist = (os.path.abspath(arg) for arg in sys.argv[1:])
    version, data, files = layout(prefix)
    os.makedirs(dist, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dlrun-wheel-") as work:
        bundled = bundle(files, data, work)
        # The tag from a look without the CUDA module (it needs NVIDIA's libraries on the node).
        probe = os.path.join(work, f"dlrun-{version}-py3-none-linux_x86_64.whl")
        pack(
            probe,
            {k: v for k, v in files.items() if not k.endswith(CUDA_MODULE)},
            version,
            "py3-none-linux_x86_64",
        )
        plat, _ = platform_tag(probe)
        if not plat.startswith("manylinux_"):
            raise SystemExit(f"wheel: auditwheel show finds no manylinux tag ({plat})")
        tag = f"py3-none-{plat}"
        wheel = os.path.join(dist, f"dlrun-{version}-{tag}.whl")
        pack(wheel, files, version, tag)
    said = run(["auditwheel", "show", wheel])
    size = os.path.getsize(wheel) / 1e6
    print(
        f"wheel: {wheel}\nwheel: {size:.1f} MB (budget {SIZE_BUDGET_MB} MB); bundled: "
        f"{', '.join(bundled) or 'nothing'}\n{said.strip()}"
    )
    if size > SIZE_BUDGET_MB:
        raise SystemExit(f"wheel: {size:.1f} MB is over the budget of {SIZE_BUDGET_MB} MB")


if __name__ == "__main__":
    main()
