"""dlrun's wheel (issue 46, acceptance 1 and 4; docs/guides/install.md): `scripts/wheel.sh
--built` packs this build into a wheel whose tag is the manylinux one `auditwheel show` finds it
consistent with, within its size budget; `pip install --no-index` puts it into a fresh venv
(nothing can be fetched). Then, with the build and source directories hidden (tmpfs mounts in a
mount namespace of each run's own) and PATH the venv's bin and the system's:
- `dlrun`, `dlrund` and `dlrun-train` on PATH are the venv's; `python -m dlrun` runs dlrun;
- a torch 2.13 DDP script under `dlrun --standalone --nproc-per-node=2` runs with the venv's
  interpreter, imports dlrun.progress from the venv, and its steps reach the agent (/api/state);
- with --warm-start, workers fork from a zygote of the venv's interpreter (the zygote's file
  from the venv's share/dlrun/python);
- `dlrun train --synthetic` trains on 2 workers with the venv's AVX2 module;
- a job rendezvouses through the venv's dlrund, which counts its connections;
- without dlrun, the venv's Python imports dlrun.progress from site-packages, inactive.
torch is the tests' torch 2.13 (DLRUN_TORCH2_PYTHON's environment), reached through a .pth file:
the venv stays fresh and nothing is downloaded."""

import glob
import json
import os
import re
import shutil
import unittest

from dlrun_fixture import EVENT_TIMEOUT_S, Dlrun, clean_env, main, temp_dir, wait_until, worker
from dlrund_fixture import Dlrund
from metrics_fixture import http_get, metrics_port
from package_fixture import build_dir, class_temp_dir, run

SOURCE_DIR = os.environ["DLRUN_SOURCE_DIR"]
TORCH_PYTHON = os.environ["DLRUN_TORCH2_PYTHON"]
SIZE_BUDGET_MB = 25  # scripts/wheel.py's
JOB_TIMEOUT_S = 120
STEPS = 5  # workers/wheel_ddp.py's

# Execs its arguments with the build and source directories under empty tmpfs mounts, in a
# mount namespace of its own that ends with the command (the PID stays the command's).
HIDING = r"""#!/bin/sh
set -e
exec unshare --mount --propagation private {map_root} sh -c '
  mount -t tmpfs hidden "{build}" && mount -t tmpfs hidden "{source}" &&
  test ! -e "{build}/CMakeCache.txt" && exec "$@"' sh "$@"
"""


def write_script(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = class_temp_dir(cls)
        dist = os.path.join(cls.scratch, "dist")
        cls.packed = run(
            ["bash", os.path.join(SOURCE_DIR, "scripts", "wheel.sh"), "--built"],
            env=dict(os.environ, DLRUN_BUILD_DIR=build_dir(), DLRUN_DIST_DIR=dist),
        )
        wheels = glob.glob(os.path.join(dist, "*.whl"))
        if len(wheels) != 1:
            raise AssertionError(f"wheel.sh made {wheels}, not one wheel:\n{cls.packed}")
        cls.wheel = wheels[0]
        base_python = run([TORCH_PYTHON, "-c", "import sys; print(sys._base_executable)"])
        cls.venv = os.path.join(cls.scratch, "venv")
        run([base_python.strip(), "-m", "venv", cls.venv])
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.installed = run(
            [cls.python, "-m", "pip", "install", "--no-index", "--no-cache-dir", cls.wheel]
        )
        purelib = run([cls.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
        cls.site_packages = purelib.strip()
        torch_lib = run(
            [TORCH_PYTHON, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        )
        with open(os.path.join(cls.site_packages, "torch_of_the_tests.pth"), "w") as f:
            f.write(torch_lib.strip() + "\n")
        cls.hide = write_script(
            os.path.join(cls.scratch, "hidden"),
            HIDING.format(
                build=build_dir(),
                source=SOURCE_DIR,
                map_root="" if os.geteuid() == 0 else "--map-root-user",
            ),
        )
        cls.env = clean_env(PATH=f"{cls.venv}/bin:/usr/bin:/bin", PYTHONPATH=None, VIRTUAL_ENV=None)
        # The fixtures start the dlrun named by DLRUN: the venv's.
        os.environ["DLRUN"] = os.path.join(cls.venv, "bin", "dlrun")

    def hidden(self, args, **kwargs):
        return run([self.hide, *args], env=self.env, cwd=self.scratch, **kwargs)

    def hidden_dlrun(self, args, env=None):
        """The venv's dlrun run to its end with the build hidden: its Result."""
        return Dlrun(self, args, env=env or self.env, cwd=self.scratch, wrapper=[self.hide]).wait(
            JOB_TIMEOUT_S
        )

    def test_wheel_is_manylinux_within_its_budget_and_installs_without_the_network(self):
        self.assertRegex(
            os.path.basename(self.wheel), r"^dlrun-[\d.]+-py3-none-manylinux_2_\d+_x86_64\.whl$"
        )
        plat = re.search(r"manylinux_2_\d+_x86_64", self.wheel).group(0)
        self.assertRegex(
            self.packed, rf'consistent with the\s+following\s+platform\s+tag:\s+"{plat}"'
        )
        self.assertLessEqual(os.path.getsize(self.wheel), SIZE_BUDGET_MB * 1e6, self.packed)
        self.assertIn("Successfully installed dlrun-", self.installed)
        self.assertNotIn("Downloading", self.installed)
        print(self.packed)

    def test_programs_on_path_are_the_venvs_and_python_m_dlrun_runs_dlrun(self):
        output = self.hidden(
            [
                "sh",
                "-c",
                "for p in dlrun dlrund dlrun-train; do command -v $p; "
                "done && python -m dlrun --version",
            ]
        )
        bin_dir = os.path.join(self.venv, "bin")
        self.assertEqual(
            output.splitlines()[:3],
            [os.path.join(bin_dir, name) for name in ("dlrun", "dlrund", "dlrun-train")],
        )
        self.assertRegex(output.splitlines()[3], r"^dlrun \d+\.\d+\.\d+ \(git \S+\)$")

    def test_torch_ddp_script_runs_with_the_venvs_python_and_reports_progress(self):
        job = temp_dir(self)
        for name in ("wheel_ddp.py", "worker_util.py"):
            shutil.copy(worker(name), job)
        out = os.path.join(job, "out")
        os.mkdir(out)
        launcher = Dlrun(
            self,
            [
                "--standalone",
                "--nproc-per-node=2",
                "--metrics-port=0",
                os.path.join(job, "wheel_ddp.py"),
                out,
            ],
            env=self.env,
            cwd=job,
            wrapper=[self.hide],
        )
        port = metrics_port(launcher)

        def last_step():
            curve = json.loads(http_get(port, "/api/state")[2])["curve"]
            return curve and curve[-1][1] == STEPS

        wait_until(
            last_step,
            JOB_TIMEOUT_S,
            f"the agent's curve to reach step {STEPS}",
            on_timeout=launcher.describe,
        )
        reports = [os.path.join(out, f"rank-{rank}.json") for rank in (0, 1)]
        wait_until(
            lambda: all(map(os.path.exists, reports)),
            EVENT_TIMEOUT_S,
            "both workers' reports",
            on_timeout=launcher.describe,
        )
        open(os.path.join(out, "release"), "w").close()
        result = launcher.wait(JOB_TIMEOUT_S)
        self.assertEqual(result.returncode, 0, launcher.describe())
        for path in reports:
            with open(path) as f:
                report = json.load(f)
            self.assertEqual(report["executable"], os.path.join(self.venv, "bin", "python3"))
            self.assertTrue(report["torch"].startswith("2.13."), report)
            self.assertEqual((report["world"], report["rank_sum"]), (2, 3.0))
            self.assertTrue(report["progress"].startswith(self.venv + "/"), report)
            self.assertTrue(report["reports"], report)

    def test_warm_start_forks_workers_from_the_venvs_zygote(self):
        probe = os.path.join(temp_dir(self), "probe.py")
        with open(probe, "w") as f:
            f.write(
                "import sys\nprint('worker:', sys.executable, 'dlrun.progress' in sys.modules)\n"
            )
        result = self.hidden_dlrun(
            [
                "--standalone",
                "--nproc-per-node=2",
                "--warm-start",
                "--preload=dlrun.progress",
                probe,
            ]
        )
        self.assertEqual(result.returncode, 0, result)
        self.assertRegex(
            result.stderr,
            r"warm start: Python [\d.]+ \(pid \d+\) ready, "
            r"dlrun.progress imported",
        )
        python = os.path.join(self.venv, "bin", "python3")
        self.assertEqual(result.stdout.count(f"worker: {python} True"), 2, result)

    def test_bundled_trainer_trains_on_synthetic_data(self):
        env = dict(self.env, DLRUN_LOG_LEVEL="debug")
        result = self.hidden_dlrun(
            [
                "--standalone",
                "--nproc-per-node=2",
                "train",
                "--synthetic",
                "--epochs",
                "1",
                "--max-steps",
                "20",
            ],
            env=env,
        )
        result_text = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, result_text)
        self.assertRegex(result.stdout, r'"world_size": 2, .*"device": "cpu"')
        module = os.path.join(self.venv, "lib", "dlrun", "trainer", "dlrun-train-avx2.so")
        self.assertTrue(
            f"CPU math: avx2 ({module})" in result_text
            or "CPU math: baseline (this CPU lacks AVX2 or FMA)" in result_text,
            result_text,
        )

    def test_a_job_rendezvouses_through_the_venvs_dlrund(self):
        daemon_path = write_script(
            os.path.join(temp_dir(self), "dlrund"),
            f'#!/bin/sh\nexec {self.hide} {self.venv}/bin/dlrund "$@"\n',
        )
        daemon = Dlrund("--stats", binary=daemon_path)
        self.addCleanup(daemon.stop)
        agents = [
            Dlrun(
                self,
                [
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    f"--rdzv-endpoint=127.0.0.1:{daemon.port}",
                    "--rdzv-id=wheel",
                    "train",
                    "--synthetic",
                    "--epochs",
                    "1",
                    "--max-steps",
                    "10",
                ],
                env=self.env,
                cwd=self.scratch,
                wrapper=[self.hide],
            )
            for _ in range(2)
        ]
        for agent in agents:
            result = agent.wait(JOB_TIMEOUT_S)
            self.assertEqual(result.returncode, 0, agent.describe())
        self.assertRegex(agents[0].output()[0] + agents[1].output()[0], r'"world_size": 2, ')
        daemon.proc.terminate()
        said, _ = daemon.proc.communicate(timeout=EVENT_TIMEOUT_S)
        self.assertEqual(daemon.proc.returncode, 0, said)
        requests = re.search(rb"dlrund stats: .* requests=(\d+) ", said)
        self.assertTrue(requests and int(requests.group(1)) > 0, said)

    def test_progress_module_outside_dlrun_is_the_venvs_and_inactive(self):
        output = self.hidden(
            ["python", "-c", "import dlrun.progress as p; p.step(1); print(p.__file__, p.active())"]
        )
        self.assertEqual(
            output.strip(), f"{os.path.join(self.site_packages, 'dlrun', 'progress.py')} False"
        )


if __name__ == "__main__":
    main()
