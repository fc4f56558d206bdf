"""--numa-binding (issue 31, acceptance 3): each worker runs on the CPUs torchrun 2.13's binding
gives it, read from the kernel (Cpus_allowed_list) by the worker itself.

- Two fake machines (DLRUN_SYSFS_ROOT: a directory standing for /, whose sys/ dlrun reads): one
  socket with two NUMA nodes, one CPU and one GPU each; and one node with both CPUs, an L3
  each, and both GPUs. Between them every mode gives other sets than some other mode. Their two
  CPUs are the first two this test may run on, so the binding can be applied here.
- This machine's own sysfs, without GPUs: the workers are spread over its NUMA nodes.
- Bad values and impossible bindings: one line, exit 2, no worker started.

The unit test (tests/numa_binding_test.cpp) checks every mode on a two-socket, eight-GPU tree.
"""

import os
import unittest

from dlrun_fixture import clean_env, main, run_dlrun, temp_dir

# The worker: its local rank's allowed CPUs, as the kernel reports them, into OUT/<local rank>.
REPORT = 'grep Cpus_allowed_list: /proc/self/status | cut -f2 > "$OUT/$LOCAL_RANK"'


def cpu_list(text):
    """The CPUs of a kernel list ("0-2,5")."""
    cpus = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def write(root, path, text):
    path = os.path.join(root, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def fake_machine(root, a, b, one_node=False):
    """One socket; NUMA node 0 holds CPU a, node 1 CPU b (one_node: node 0 both), each CPU a core
    of its own; one L3 for both (one_node: an L3 each); GPU 0 (by PCI address) on node 0, GPU 1
    on node 1 (one_node: node 0), and a NIC."""
    cpu = "sys/devices/system/cpu"
    write(root, f"{cpu}/online", f"{a},{b}")
    nodes = {0: [a, b]} if one_node else {0: [a], 1: [b]}
    for node, members in nodes.items():
        write(root, f"sys/devices/system/node/node{node}/cpulist", ",".join(map(str, members)))
    for c in (a, b):
        write(root, f"{cpu}/cpu{c}/topology/physical_package_id", "0")
        write(root, f"{cpu}/cpu{c}/topology/thread_siblings_list", str(c))
        l3 = str(c) if one_node else f"{a},{b}"
        for index, (kind, level, shared) in enumerate((("Data", 1, str(c)), ("Unified", 3, l3))):
            cache = f"{cpu}/cpu{c}/cache/index{index}"
            write(root, f"{cache}/type", kind)
            write(root, f"{cache}/level", str(level))
            write(root, f"{cache}/shared_cpu_list", shared)
    for address, vendor, pci_class, node in (
        ("0000:3b:00.0", "0x10de", "0x030200", 0),
        ("0000:af:00.0", "0x10de", "0x030200", 0 if one_node else 1),
        ("0000:18:00.0", "0x15b3", "0x020700", 0),
    ):
        device = f"sys/bus/pci/devices/{address}"
        write(root, f"{device}/vendor", vendor)
        write(root, f"{device}/class", pci_class)
        write(root, f"{device}/numa_node", str(node))


class NumaBindingTest(unittest.TestCase):
    def setUp(self):
        allowed = sorted(os.sched_getaffinity(0))
        self.assertGreaterEqual(len(allowed), 2, "the test needs two CPUs to bind to")
        self.a, self.b = allowed[:2]
        self.root = temp_dir(self)
        fake_machine(self.root, self.a, self.b)

    def bind(self, mode, nproc=2, env=None, expect=0):
        """Runs nproc workers under --numa-binding=mode; {local rank: its CPUs}."""
        out = temp_dir(self)
        result = run_dlrun(
            self,
            [
                f"--numa-binding={mode}",
                f"--nproc-per-node={nproc}",
                "--no-python",
                "/bin/sh",
                "-c",
                REPORT,
            ],
            env=clean_env(OUT=out, OMP_NUM_THREADS="1", **(env or {})),
        )
        self.assertEqual(result.returncode, expect, result)
        cpus = {}
        for name in os.listdir(out):
            with open(os.path.join(out, name)) as f:
                cpus[int(name)] = cpu_list(f.read())
        return cpus, result

    def test_each_mode_on_a_fake_machine(self):
        a, b = self.a, self.b
        # Two nodes on one socket, a GPU on each, one L3 for both.
        expected = {
            "node": {0: {a}, 1: {b}},  # the GPU's node
            "socket": {0: {a, b}, 1: {a, b}},  # every node of the GPU's socket
            "exclusive": {0: {a}, 1: {b}},  # the node's cores shared among its GPUs
            "core-complex": {0: {a}, 1: {b}},  # the node's CPUs under one L3: all of them
        }
        for mode, sets in expected.items():
            with self.subTest(mode=mode):
                cpus, _ = self.bind(mode, env={"DLRUN_SYSFS_ROOT": self.root})
                self.assertEqual(cpus, sets)

    def test_each_mode_with_two_gpus_on_one_node(self):
        a, b = self.a, self.b
        root = temp_dir(self)
        fake_machine(root, a, b, one_node=True)  # both GPUs on node 0, an L3 per CPU
        expected = {
            "node": {0: {a, b}, 1: {a, b}},
            "socket": {0: {a, b}, 1: {a, b}},
            "exclusive": {0: {a}, 1: {b}},  # a core each
            "core-complex": {0: {a}, 1: {b}},  # an L3 each
        }
        for mode, sets in expected.items():
            with self.subTest(mode=mode):
                cpus, _ = self.bind(mode, env={"DLRUN_SYSFS_ROOT": root})
                self.assertEqual(cpus, sets)

    def test_cuda_visible_devices_reorders_the_gpus(self):
        cpus, _ = self.bind(
            "node", env={"DLRUN_SYSFS_ROOT": self.root, "CUDA_VISIBLE_DEVICES": "1,0"}
        )
        self.assertEqual(cpus, {0: {self.b}, 1: {self.a}})

    def test_without_binding_workers_keep_the_launchers_cpus(self):
        cpus, _ = self.bind("node", nproc=1, env={"DLRUN_SYSFS_ROOT": self.root})
        self.assertEqual(cpus, {0: {self.a}})
        out = temp_dir(self)
        result = run_dlrun(
            self,
            ["--nproc-per-node=1", "--no-python", "/bin/sh", "-c", REPORT],
            env=clean_env(OUT=out, DLRUN_SYSFS_ROOT=self.root),
        )
        self.assertEqual(result.returncode, 0, result)
        with open(os.path.join(out, "0")) as f:
            self.assertEqual(cpu_list(f.read()), os.sched_getaffinity(0))

    def test_this_machine_without_gpus(self):
        # No GPU here: each worker gets the CPUs of the NUMA node its block falls on, all of
        # them allowed ones; one node (as here) gives every worker every allowed CPU.
        nodes = [n for n in os.listdir("/sys/devices/system/node") if n.startswith("node")]
        allowed = os.sched_getaffinity(0)
        cpus, _ = self.bind("node", env={"CUDA_VISIBLE_DEVICES": ""})
        self.assertEqual(sorted(cpus), [0, 1])
        for rank, given in cpus.items():
            self.assertTrue(given and given <= allowed, (rank, given))
        if len(nodes) == 1:
            self.assertEqual(cpus, {0: allowed, 1: allowed})

    def test_bad_values_are_one_line_and_start_nothing(self):
        cases = [
            ("bogus", {}, ["--numa-binding", "'bogus'"]),
            ("node", {"DLRUN_SYSFS_ROOT": None}, ["3 workers but 2 GPUs"]),
            (
                "node",
                {"DLRUN_SYSFS_ROOT": None, "CUDA_VISIBLE_DEVICES": "GPU-5e1d"},
                ["CUDA_VISIBLE_DEVICES"],
            ),
        ]
        for mode, env, words in cases:
            with self.subTest(mode=mode, env=env):
                env = {k: self.root if v is None else v for k, v in env.items()}
                cpus, result = self.bind(mode, nproc=3, env=env, expect=2)
                self.assertEqual(cpus, {}, result)
                lines = result.stderr.splitlines()
                self.assertEqual(len(lines), 1, result)
                self.assertTrue(lines[0].startswith("dlrun: error: --numa-binding: "), result)
                for word in words:
                    self.assertIn(word, lines[0])


if __name__ == "__main__":
    main()
