"""What the workers' torch needs of its store, found without importing torch (which costs 1-2 s
of CPU): dlrun runs this under the workers' interpreter and environment before it starts them
(launcher/torch_probe.h). Prints one JSON line: {} where no torch is found, else {"version",
"path", "libuv"}; "libuv" is false only for a build whose TCPStore lacks libuv, whose library
then holds the message its #else branch throws; null where no library was found to read.

torch 2.4 and later ask for libuv in every TCPStore client an agent's store gets
(torch/distributed/rendezvous.py), which such a build refuses: Debian 13's torch 2.6 is one."""

import importlib.util
import json
import mmap
import os
import re
import struct
import sys
import sysconfig

# Only a build without libuv compiles this message in (TCPStoreLibUvBackend.cpp's #else).
NO_LIBUV = b"LibUV TCPStore implementation missing"
LIBRARY = "libtorch_cpu.so"


def version_of(torch_dir):
    try:
        with open(os.path.join(torch_dir, "version.py")) as f:
            found = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", f.read(), re.M)
    except OSError:
        return None
    return found.group(1) if found else None


def library_of(torch_dir):
    """torch's own lib/ (PyPI's wheels), else where the loader looks (Debian's libtorch)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [os.path.join(torch_dir, "lib")]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [os.path.join(p, multiarch) for p in ("/usr/lib", "/lib") if multiarch]
    dirs += ["/usr/local/lib", "/usr/lib", "/lib"]
    for d in dirs:
        try:
            names = sorted(n for n in os.listdir(d) if n.startswith(LIBRARY))
        except OSError:
            continue
        if names:
            return os.path.join(d, names[0])
    return None


def rodata(data):
    """(start, end) of an ELF64 file's .rodata section, where string literals are; the whole
    file where the headers say otherwise (a quarter of the time of reading torch's 430 MB)."""
    whole = (0, len(data))
    if data[:5] != b"\x7fELF\x02" or len(data) < 64:
        return whole
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", data, 0x3A)
    if entsize < 64 or names >= count or shoff + count * entsize > len(data):
        return whole

    def section(i):  # (name offset, file offset, size)
        at = shoff + i * entsize
        (name,) = struct.unpack_from("<I", data, at)
        offset, size = struct.unpack_from("<QQ", data, at + 0x18)
        return name, offset, size

    _, table, _ = section(names)
    for i in range(count):
        name, offset, size = section(i)
        if data[table + name : table + name + 8] == b".rodata\0" and offset + size <= len(data):
            return offset, offset + size
    return whole


def holds(path, needle):
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start, end = rodata(data)
        return data.find(needle, start, end) >= 0


def main():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        print("{}")
        return
    torch_dir = list(spec.submodule_search_locations)[0]
    library = library_of(torch_dir)
    libuv = None if library is None else not holds(library, NO_LIBUV)
    print(json.dumps({"version": version_of(torch_dir), "path": torch_dir, "libuv": libuv}))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # dlrun then starts the workers as it would without this answer
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
