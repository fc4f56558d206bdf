"""dlrun's command line as a user meets it: invalid input is one line on stderr naming the flag
and the problem, exit 2, and no worker started; and the entry-point forms (a program on PATH, a
path, a .py script, -m module, --no-python, the bundled `train`)."""

import os
import shutil
import socket
import stat
import subprocess
import threading
import unittest

from dlrun_fixture import (
    PYTHON,
    WORKERS,
    binary_from_env,
    clean_env,
    die_with_parent,
    dlrun_binary,
    main,
    read_json,
    run_dlrun,
    temp_dir,
    worker,
)

ENV_DUMP = worker("env_dump.py")


class ControlCommandBadInputTest(unittest.TestCase):
    """`dlrun status|events|stop` against what is no dlrun job: one line, exit 2, no hang."""

    def assert_one_line(self, args, mentions):
        result = run_dlrun(self, [*args, "--timeout=2"], timeout=20)
        self.assertEqual(result.returncode, 2, result)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result)
        for word in mentions:
            self.assertIn(word, lines[0], result)

    def test_malformed_endpoint_and_missing_flags(self):
        self.assert_one_line(
            ["status", "--rdzv-endpoint=127.0.0.1:notaport", "--rdzv-id=j"],
            ["--rdzv-endpoint", "notaport"],
        )
        self.assert_one_line(["events", "--rdzv-id=j"], ["--rdzv-endpoint"])
        self.assert_one_line(
            ["stop", "--rdzv-endpoint=127.0.0.1", "--rdzv-id=j", "--signal=NOPE"],
            ["--signal", "NOPE"],
        )

    def test_an_endpoint_that_is_not_dlrun(self):
        # A plain TCP echo server: it accepts and sends back whatever comes.
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        self.addCleanup(server.close)

        def echo():
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    while data := conn.recv(4096):
                        conn.sendall(data)

        threading.Thread(target=echo, daemon=True).start()
        port = server.getsockname()[1]
        self.assert_one_line(
            ["status", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=j"],
            ["no dlrun control plane answers", f"127.0.0.1:{port}"],
        )

    def test_an_unknown_job_on_a_real_store(self):
        # dlrund serves the control plane on its store port; it knows no job 'nobody'.
        dlrund = subprocess.Popen(
            [binary_from_env("DLRUND", "dlrund"), "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        self.addCleanup(dlrund.wait)
        self.addCleanup(dlrund.kill)
        port = dlrund.stdout.readline().strip().rsplit(":", 1)[1]
        self.assert_one_line(
            ["status", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=nobody"], ["no job 'nobody'"]
        )


class DlrunInvalidInputTest(unittest.TestCase):
    def assert_rejected(self, args, mentions, env=None):
        """dlrun exits 2 with exactly one stderr line containing every word in `mentions`,
        prints nothing on stdout, and never runs its entry point (which would create a file)."""
        out = temp_dir(self)
        marker = os.path.join(out, "worker-ran")
        result = run_dlrun(self, [*args, "/usr/bin/touch", marker], env=env, timeout=10)
        self.assertEqual(result.returncode, 2, result)
        self.assertEqual(result.stdout, "", result)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result)
        for word in mentions:
            self.assertIn(word, lines[0], result)
        self.assertFalse(os.path.exists(marker), f"a worker ran: {result}")

    def test_bad_flag_values(self):
        cases = [
            (["--nproc-per-node=0"], ["--nproc-per-node", "0"]),
            (["--nproc_per_node=0"], ["nproc", "0"]),
            (["--nproc-per-node=many"], ["--nproc-per-node", "many"]),
            (["--nnodes=3:2"], ["--nnodes"]),
            (["--nnodes=0"], ["--nnodes"]),
            (["--nnodes=1:2:3"], ["--nnodes", "1:2:3"]),
            (["--rdzv-backend=carrier-pigeon"], ["--rdzv-backend", "carrier-pigeon"]),
            (["--rdzv-backend=etcd", "--nnodes=2"], ["--rdzv-endpoint", "DLRUN_ETCD_ENDPOINTS"]),
            (
                ["--rdzv-backend=etcd-v2", "--nnodes=2", "--rdzv-endpoint=127.0.0.1:29400"],
                ["--rdzv-backend=etcd-v2", "v3 API"],
            ),
            (["--nnodes=2"], ["--nnodes=2", "--rdzv-endpoint"]),
            (["--rdzv-conf=timeout"], ["--rdzv-conf", "timeout"]),
            (["--rdzv-conf=a=1,,b=2"], ["--rdzv-conf"]),
            (["--master-port=http"], ["--master-port", "http"]),
            (["--master-port=70000"], ["--master-port", "70000"]),
            (["--max-restarts=-1"], ["--max-restarts"]),
            (["--redirects=4"], ["--redirects", "4"]),
            (["-t", "0:9"], ["--tee", "0:9"]),
            (["--local-ranks-filter=one"], ["--local-ranks-filter", "one"]),
            (["--standalone", "--nnodes=2"], ["--standalone", "--nnodes"]),
            (["-m", "--no-python"], ["--module", "--no-python"]),
            (["--start-method=thread"], ["--start-method", "thread"]),
            (["--signals-to-handle=SIGTERM,SIGKILL"], ["--signals-to-handle", "SIGKILL"]),
            (["--signals-to-handle=SIGNOPE"], ["--signals-to-handle", "SIGNOPE"]),
            (
                ["--stop-timeout=1", "--shutdown-timeout=2"],
                ["--stop-timeout", "--shutdown-timeout"],
            ),
        ]
        for args, mentions in cases:
            with self.subTest(args=args):
                self.assert_rejected(args, mentions)

    def test_non_numeric_rendezvous_port(self):
        self.assert_rejected(
            ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:http"], ["--rdzv-endpoint", "http"]
        )

    def test_bad_pet_variable(self):
        self.assert_rejected([], ["nproc", "0"], env=clean_env(PET_NPROC_PER_NODE="0"))

    def test_missing_entry_point(self):
        for args, mentions in (
            ([], ["entry point"]),
            (["/nonexistent/dir/train.py"], ["/nonexistent/dir/train.py"]),
            (["no-such-program-on-path"], ["no-such-program-on-path"]),
        ):
            with self.subTest(args=args):
                result = run_dlrun(self, ["--nproc-per-node=2", *args], timeout=10)
                self.assertEqual(result.returncode, 2, result)
                lines = result.stderr.splitlines()
                self.assertEqual(len(lines), 1, result)
                for word in mentions:
                    self.assertIn(word, lines[0])

    def test_unknown_flag(self):
        self.assert_rejected(["--nproc-per-nodes=2"], ["--nproc-per-nodes"])

    def test_ambiguous_abbreviation(self):
        # argparse's abbreviations, as torchrun takes them: a unique prefix is the flag itself.
        self.assert_rejected(["--no"], ["ambiguous flag --no", "--no-python"])


class DlrunEntryPointTest(unittest.TestCase):
    def dump(self, args, env=None, cwd=None, expect=1):
        out = temp_dir(self)
        result = run_dlrun(self, [f"--nproc-per-node={expect}", *args(out)], env=env, cwd=cwd)
        self.assertEqual(result.returncode, 0, result)
        names = sorted(os.listdir(out))
        self.assertEqual(names, [f"env_{r}.json" for r in range(expect)], result)
        return [read_json(os.path.join(out, n)) for n in names]

    def test_py_script_runs_unbuffered_under_python_exec(self):
        records = self.dump(
            lambda out: [ENV_DUMP, out], env=clean_env(PYTHON_EXEC=PYTHON), expect=2
        )
        for rec in records:
            self.assertEqual(rec["orig_argv"][:3], [PYTHON, "-u", ENV_DUMP])
            self.assertTrue(rec["stdout_write_through"])  # what -u does to sys.stdout

    def test_relative_py_script(self):
        records = self.dump(
            lambda out: ["env_dump.py", out], env=clean_env(PYTHON_EXEC=PYTHON), cwd=WORKERS
        )
        self.assertEqual(records[0]["orig_argv"][:3], [PYTHON, "-u", "env_dump.py"])

    def test_module(self):
        env = clean_env(PYTHON_EXEC=PYTHON, PYTHONPATH=WORKERS)
        for flag in ("-m", "--module"):
            with self.subTest(flag=flag):
                records = self.dump(lambda out: [flag, "env_dump", out], env=env, expect=2)
                self.assertEqual(records[0]["orig_argv"][:4], [PYTHON, "-u", "-m", "env_dump"])

    def test_program_on_path_and_no_python(self):
        bin_dir = temp_dir(self)
        script = os.path.join(bin_dir, "dump-env")
        with open(script, "w") as f:
            f.write(
                f"#!{PYTHON}\nimport runpy, sys\nsys.path.insert(0, {WORKERS!r})\n"
                f"runpy.run_path({ENV_DUMP!r}, run_name='__main__')\n"
            )
        os.chmod(script, stat.S_IRWXU)
        env = clean_env(PATH=bin_dir + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
        records = self.dump(lambda out: ["dump-env", out], env=env, expect=2)
        self.assertEqual(records[0]["orig_argv"][:2], [PYTHON, script])
        # --no-python executes a script file itself, whatever its name.
        named_py = os.path.join(bin_dir, "dump_env.py")
        os.rename(script, named_py)
        records = self.dump(lambda out: ["--no-python", named_py, out], env=env)
        self.assertEqual(records[0]["orig_argv"][:2], [PYTHON, named_py])

    def test_worker_arguments_are_not_dlrun_flags(self):
        # Everything after the entry point belongs to the worker, flags included.
        out = temp_dir(self)
        result = run_dlrun(
            self, ["--nproc-per-node=1", PYTHON, ENV_DUMP, out, "--nproc-per-node=3"]
        )
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(os.listdir(out), ["env_0.json"])
        rec = read_json(os.path.join(out, "env_0.json"))
        self.assertEqual(rec["orig_argv"][-1], "--nproc-per-node=3")

    def test_bundled_trainer_missing_is_one_line(self):
        # A copy of dlrun in a directory without dlrun-train beside it.
        alone = os.path.join(temp_dir(self), "dlrun")
        shutil.copy(dlrun_binary(), alone)
        result = subprocess.run(
            [alone, "--nproc-per-node=1", "train"],
            capture_output=True,
            text=True,
            timeout=10,
            env=clean_env(),
        )
        self.assertNotEqual(result.returncode, 0, result)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result)
        self.assertIn("dlrun-train", lines[0])


if __name__ == "__main__":
    main()
