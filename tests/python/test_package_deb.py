"""The Debian package (issue 17, acceptance 1): `cpack -G DEB` from the normal build makes
dlrun_VERSION_amd64.deb, the same from any build (a build with CUDA adds
dlrun-cuda_VERSION_amd64.deb, the trainer's CUDA engine alone, depending on dlrun), whose
Depends name the package of every shared library the programs load (what dpkg-shlibdeps
computes), which recommends the trainer's data, holds the installed tree at /usr with
/etc/default/dlrund as a conffile, and in which lintian finds no error (its warnings are
printed)."""

import os
import subprocess
import unittest

from dlrun_fixture import main
from package_fixture import build_dir, class_temp_dir, make_packages, run, with_cuda

PROGRAMS = ("usr/bin/dlrun", "usr/bin/dlrund", "usr/bin/dlrun-train", "usr/libexec/dlrun/dlrun-tls")


def field(package, name):
    return subprocess.run(
        ["dpkg-deb", "-f", package, name], stdout=subprocess.PIPE, text=True, check=True
    ).stdout.strip()


def needed_packages(program):
    """The Debian packages of the shared libraries `program` loads; libraries no package owns
    (NVIDIA's CUDA runtime, say) are left out, as dpkg-shlibdeps leaves them."""
    dynamic = subprocess.run(
        ["readelf", "-d", program], stdout=subprocess.PIPE, text=True, check=True
    ).stdout
    sonames = [
        line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line
    ]
    cache = subprocess.run(["ldconfig", "-p"], stdout=subprocess.PIPE, text=True, check=True).stdout
    packages = set()
    for soname in sonames:
        paths = [
            line.split(" => ")[1]
            for line in cache.splitlines()
            if line.strip().startswith(soname + " ") and "x86-64" in line
        ]
        # dpkg knows a file by the path it was unpacked to: the loader's (a symlink to the
        # versioned file) or the real one, /lib or /usr/lib (merged /usr).
        candidates = {
            paths[0],
            os.path.realpath(paths[0]),
            os.path.join(os.path.dirname(paths[0]), os.path.basename(os.path.realpath(paths[0]))),
        }
        for path in candidates:
            owner = subprocess.run(
                ["dpkg", "-S", path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
            if owner.returncode == 0:
                packages.add(owner.stdout.split(":")[0])
    return packages


class PackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = class_temp_dir(cls)
        cls.packages = make_packages(cls.out)
        cls.package = cls.packages["dlrun"]

    def test_name_version_and_fields(self):
        name = "dlrun"
        version = os.environ["DLRUN_VERSION"]
        self.assertEqual(os.path.basename(self.package), f"{name}_{version}_amd64.deb")
        self.assertEqual(field(self.package, "Package"), name)
        self.assertEqual(field(self.package, "Version"), version)
        self.assertEqual(field(self.package, "Recommends"), "dataset-fashion-mnist")
        description = field(self.package, "Description").splitlines()
        self.assertIn("launcher", description[0])
        self.assertGreaterEqual(len(description), 3, "an extended description")

    def test_the_cuda_engine_is_an_add_on(self):
        listing = run(["dpkg-deb", "-c", self.package])
        self.assertNotIn("dlrun-train-cuda.so", listing)  # dlrun is the same from every build
        if not with_cuda():
            return
        cuda = self.packages["dlrun-cuda"]
        version = os.environ["DLRUN_VERSION"]
        self.assertEqual(os.path.basename(cuda), f"dlrun-cuda_{version}_amd64.deb")
        self.assertIn(f"dlrun (= {version})", field(cuda, "Depends"))
        for conflicting in ("Conflicts", "Replaces", "Provides"):
            self.assertEqual(field(cuda, conflicting), "")
        paths = {
            line.split()[5].removeprefix(".") for line in run(["dpkg-deb", "-c", cuda]).splitlines()
        }
        self.assertIn("/usr/lib/dlrun/trainer/dlrun-train-cuda.so", paths)
        self.assertIn("/usr/share/doc/dlrun-cuda/copyright", paths)
        self.assertFalse(any(p.startswith("/usr/bin/") for p in paths), paths)

    def test_depends_name_every_library_package(self):
        depends = {entry.split()[0] for entry in field(self.package, "Depends").split(", ")}
        root = os.path.join(self.out, "root")
        run(["dpkg-deb", "-x", self.package, root])
        for program in PROGRAMS:
            for package in needed_packages(os.path.join(root, program)):
                self.assertIn(package, depends, f"for {program}")

    def test_contents_and_conffiles(self):
        listing = run(["dpkg-deb", "-c", self.package])
        paths = {line.split()[5].removeprefix(".") for line in listing.splitlines()}
        expected = {
            "/usr/bin/dlrun",
            "/usr/bin/dlrund",
            "/usr/bin/dlrun-train",
            "/usr/libexec/dlrun/dlrun-tls",
            "/usr/share/man/man1/dlrun.1.gz",
            "/usr/share/man/man8/dlrund.8.gz",
            "/usr/share/man/man1/dlrun-train.1.gz",
            "/usr/share/bash-completion/completions/dlrun",
            "/usr/lib/systemd/system/dlrund.service",
            "/etc/default/dlrund",
        }
        self.assertLessEqual(expected, paths)
        name = field(self.package, "Package")
        self.assertIn(f"/usr/share/doc/{name}/examples/multi_node.sbatch", paths)
        self.assertIn(f"/usr/share/doc/{name}/copyright", paths)
        control = os.path.join(self.out, "control")
        run(["dpkg-deb", "-e", self.package, control])
        with open(os.path.join(control, "conffiles")) as f:
            self.assertEqual(f.read().split(), ["/etc/default/dlrund"])

    def test_lintian_finds_no_error(self):
        result = subprocess.run(
            ["lintian", "--tag-display-limit", "0"] + sorted(self.packages.values()),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )
        print(result.stdout)
        errors = [line for line in result.stdout.splitlines() if line.startswith("E:")]
        self.assertEqual(errors, [])
        self.assertEqual(result.returncode, 0, result.stdout)


if __name__ == "__main__":
    print(f"build: {build_dir()}")
    main()
