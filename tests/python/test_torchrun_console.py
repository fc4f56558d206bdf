"""torchrun's console one flag away (issue 31, acceptance 1): the same worker
(workers/console_worker.sh) under torchrun 2.13 and under `dlrun --console-format=torchrun`, with
the flags of each row of ROWS and --log-dir; the console bytes and the log tree compared.

What is compared, after normalising (VIEW below):
- the console, stdout and stderr apart, less each launcher's own lines (torchrun's glog-style
  `W1126 23:27:37.581000 13490 torch/...py:874] ...` lines and the `*****` lines of its
  OMP_NUM_THREADS warning; dlrun's `dlrun: ...` lines; OMP_NUM_THREADS=1 silences both where it
  can). With one rank the bytes exactly (an unterminated last line and bytes that are not text
  included); with two ranks each stream's lines as a sorted list, as the launchers interleave the
  ranks' lines in no fixed order (every line is terminated there: torchrun glues the next line to
  an unterminated one);
- the --log-dir tree: one run directory named `<run id>_<8 of [a-z0-9_]>` (torchrun's mkdtemp),
  the run id being the workers' TORCHELASTIC_RUN_ID (a UUID on both without --rdzv-id), mode 0700;
  below it the same relative paths, each of the same type and mode, each file with the same
  bytes (filtered_stdout.log and filtered_stderr.log, which collect the ranks' lines in no fixed
  order: their lines sorted).

Every item that differs must be in DOCUMENTED, with its reason and a check that the two values
differ only as documented (so a documented item hides no other difference); nothing else may
differ, nor may a documented item stop differing (the entry is then out of date).

Runs under torch 2.13's interpreter (ctest: python_torchrun_console); torchrun is
`sys.executable -m torch.distributed.run`. Both launchers of a row run at once, each with its own
log directory, TMPDIR and worker record directory; every process is stopped by PID, every wait has
a deadline. CONSOLE_TEST_AGAINST=torchrun runs torchrun in dlrun's place (a check of the
comparison itself: every row must then pass with DOCUMENTED empty).
"""

import os
import re
import stat
import subprocess
import tempfile
import time
import unittest

from dlrun_fixture import (
    PYTHON,
    binary_from_env,
    clean_env,
    die_with_parent,
    kill_recorded_workers,
    main,
    read_json,
    temp_dir,
    worker,
)

WORKER = worker("console_worker.sh")
RUN_TIMEOUT_S = 90  # both launchers of a row, torchrun 2.13 starting on a loaded 2-core machine
TEMPLATE = "<${role_name}|${rank}|${local_rank}|$$|${hostname}> "


class Row:
    """One launch under each launcher: `args` after --standalone --nproc-per-node=N, `env` for
    both (the worker's switches, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE), `format_by_env`: dlrun
    gets PET_CONSOLE_FORMAT=torchrun instead of --console-format=torchrun."""

    def __init__(self, name, args, nproc=2, env=None, format_by_env=False):
        self.name, self.args, self.nproc = name, list(args), nproc
        self.env, self.format_by_env = dict(env or {}), format_by_env


ONE_RANK_BYTES = {"CONSOLE_WORKER_BYTES": "1", "CONSOLE_WORKER_NONL": "1"}

ROWS = [
    Row("no_flags", []),
    Row("tee_3", ["--tee", "3"]),
    Row("tee_1", ["--tee", "1"]),
    Row("tee_per_rank", ["--tee", "0:3,1:1"]),
    # The workers also write TORCHELASTIC_ERROR_FILE: error.json in each rank's directory.
    Row("redirects_3_error_file", ["--redirects", "3"], env={"CONSOLE_WORKER_ERROR_FILE": "1"}),
    Row("redirects_3_tee_3", ["--redirects", "3", "--tee", "3"]),
    Row("redirects_1_tee_2", ["--redirects", "1", "--tee", "2"]),
    Row("local_ranks_filter", ["--local-ranks-filter", "1"]),
    # The filter file only holds the lines of the ranks the console shows.
    Row(
        "local_ranks_filter_tee_3",
        ["--local-ranks-filter", "1", "--tee", "3", "--duplicate-stdout-filters", "apple"],
    ),
    # The template's prefix in the filter file too.
    Row(
        "prefix_template",
        ["--tee", "3", "--role", "trn", "--duplicate-stdout-filters", "apple"],
        env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": TEMPLATE},
    ),
    Row(
        "duplicate_filters",
        [
            "--duplicate-stdout-filters",
            "apple",
            "--duplicate-stderr-filters",
            "orange",
            "--tee",
            "3",
        ],
    ),
    # stderr not tee'd: its filter file is made all the same, and stays empty.
    Row(
        "duplicate_filters_tee_1",
        [
            "--duplicate-stdout-filters",
            "apple",
            "--duplicate-stderr-filters",
            "orange",
            "--tee",
            "1",
        ],
    ),
    # One rank: exact bytes, with a carriage return inside a line, a CRLF, bytes that are not
    # UTF-8 and an unterminated last line on each stream.
    Row("one_rank_tee_3", ["--tee", "3"], nproc=1, env=ONE_RANK_BYTES),
    Row("one_rank_tee_1", ["--tee", "1"], nproc=1, env=ONE_RANK_BYTES, format_by_env=True),
    Row("one_rank_tee_2", ["--tee", "2"], nproc=1, env=ONE_RANK_BYTES),
]

# The differences that remain: (row name, item of view()) -> (reason, check), check(torchrun's
# value, dlrun's value) being true when they differ only as the reason says. None so far.
DOCUMENTED = {}

# --- normalising -----------------------------------------------------------------------------

TORCHRUN_LINE = re.compile(rb"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] .*\n|\*{5,}.*\n")
DLRUN_LINE = re.compile(rb"dlrun: .*\n")
LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")
# torchrun's uuid4: 8-4-4-4-12 hex digits, version 4, RFC 4122's variant.
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
FILTERED = ("filtered_stdout.log", "filtered_stderr.log")


def lines(data):
    """`data` cut after each newline (the last piece may lack one)."""
    return LINE.findall(data)


def worker_console(data):
    """A console stream less both launchers' own lines."""
    return b"".join(
        line
        for line in lines(data)
        if not TORCHRUN_LINE.fullmatch(line) and not DLRUN_LINE.fullmatch(line)
    )


def tree(root):
    """{relative path: (kind, mode, bytes or None)} of everything below `root`."""
    entries = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            kind = (
                "dir"
                if stat.S_ISDIR(st.st_mode)
                else "file"
                if stat.S_ISREG(st.st_mode)
                else "other"
            )
            content = None
            if kind == "file":
                with open(path, "rb") as f:
                    content = f.read()
            entries[os.path.relpath(path, root)] = (kind, oct(stat.S_IMODE(st.st_mode)), content)
    return entries


def view(row, launch):
    """What is compared of one launch: {item: normalised value}."""
    items = {"exit status": launch.returncode}
    for stream, data in (("stdout", launch.stdout), ("stderr", launch.stderr)):
        console = worker_console(data)
        items[f"console {stream}"] = console if row.nproc == 1 else sorted(lines(console))
    run_ids = {record["run_id"] for record in launch.records}
    run_id = run_ids.pop() if len(run_ids) == 1 else None
    items["run id"] = (
        "one UUID"
        if run_id is not None and UUID.fullmatch(run_id)
        else f"not one UUID: {sorted(run_ids | {run_id})}"
    )
    names = sorted(os.listdir(launch.log_dir))
    run_dir_name = re.compile(re.escape(run_id or "") + r"_[a-z0-9_]{8}")
    items["log dir"] = [
        "<run id>_<8 random>" if run_id and run_dir_name.fullmatch(name) else name for name in names
    ]
    if len(names) == 1:
        run_dir = os.path.join(launch.log_dir, names[0])
        items["run dir mode"] = oct(stat.S_IMODE(os.lstat(run_dir).st_mode))
        for path, (kind, mode, content) in tree(run_dir).items():
            if content is not None and os.path.basename(path) in FILTERED:
                content = sorted(lines(content))
            items[f"log {path}"] = (kind, mode, content)
    return items


# --- launching -------------------------------------------------------------------------------


def read_all(f):
    chunks, offset = [], 0
    while chunk := os.pread(f.fileno(), 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


class Launch:
    """One launcher run to completion; its stdout and stderr in files, its workers' records
    (worker_<local rank>.json: pid, run id) in `out_dir`."""

    def __init__(self, test, tool, argv, env, nproc):
        self.tool, self.nproc = tool, nproc
        base = temp_dir(test)
        self.log_dir = os.path.join(base, "logs")  # made by the launcher
        self.argv = [*argv, "--log-dir", self.log_dir, "--no-python", WORKER]
        self.out_dir = os.path.join(base, "out")
        os.mkdir(self.out_dir)
        os.mkdir(os.path.join(base, "tmp"))
        env = dict(env, TMPDIR=os.path.join(base, "tmp"), CONSOLE_WORKER_OUT=self.out_dir)
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        test.addCleanup(self._out.close)
        test.addCleanup(self._err.close)
        # torchrun's workers lead sessions of their own and would outlive a killed torchrun.
        test.addCleanup(kill_recorded_workers, self.out_dir)
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            preexec_fn=die_with_parent,
        )
        test.addCleanup(self.kill)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def describe(self):
        return (
            f"--- {self.tool}: {' '.join(self.argv)} (exit {self.proc.returncode}) ---\n"
            f"stdout: {read_all(self._out)!r}\nstderr: {read_all(self._err)!r}\n"
        )

    def wait(self, deadline):
        try:
            self.returncode = self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.tool} still running after {RUN_TIMEOUT_S}s\n{self.describe()}"
            ) from None
        self.stdout, self.stderr = read_all(self._out), read_all(self._err)
        paths = [os.path.join(self.out_dir, f"worker_{rank}.json") for rank in range(self.nproc)]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise AssertionError(
                f"{self.tool}'s workers did not all run: no {missing}\n{self.describe()}"
            )
        self.records = [read_json(p) for p in paths]


def launcher_argv(tool, row):
    common = ["--standalone", f"--nproc-per-node={row.nproc}", *row.args]
    if tool == "torchrun" or os.environ.get("CONSOLE_TEST_AGAINST") == "torchrun":
        return [PYTHON, "-m", "torch.distributed.run", *common]
    return [
        binary_from_env("DLRUN", "dlrun"),
        *([] if row.format_by_env else ["--console-format=torchrun"]),
        *common,
    ]


def show(value):
    if isinstance(value, list):
        return "[\n" + "".join(f"      {item!r},\n" for item in value) + "    ]"
    return repr(value)


class TorchrunConsoleTest(unittest.TestCase):
    def compare(self, row):
        env = clean_env(OMP_NUM_THREADS="1", **row.env)
        dlrun_env = dict(env, PET_CONSOLE_FORMAT="torchrun") if row.format_by_env else env
        argvs = launcher_argv("torchrun", row), launcher_argv("dlrun", row)
        launches = [
            Launch(self, "torchrun", argvs[0], env, row.nproc),
            Launch(self, "dlrun", argvs[1], dlrun_env, row.nproc),
        ]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for launch in launches:
            launch.wait(deadline)
        torchrun, dlrun = launches
        details = torchrun.describe() + dlrun.describe()
        self.assertEqual(torchrun.returncode, 0, details)
        left, right = view(row, torchrun), view(row, dlrun)
        # What the comparison takes for granted of torchrun itself.
        self.assertEqual(left["run id"], "one UUID", details)
        self.assertEqual(left["log dir"], ["<run id>_<8 random>"], details)
        self.assertEqual(left["run dir mode"], "0o700", details)

        differing = {key for key in left.keys() | right.keys() if left.get(key) != right.get(key)}
        documented = {key: DOCUMENTED[name, key] for (name, key) in DOCUMENTED if name == row.name}
        unexplained = {
            key
            for key in differing
            if key not in documented or not documented[key][1](left.get(key), right.get(key))
        }
        report = "".join(
            f"  {key}"
            + (f" (documented: {documented[key][0]})" if key in documented else "")
            + f"\n    torchrun: {show(left.get(key, '<absent>'))}\n"
            f"    dlrun:    {show(right.get(key, '<absent>'))}\n"
            for key in sorted(unexplained)
        )
        if unexplained:
            self.fail(f"row {row.name}: differences outside DOCUMENTED:\n{report}{details}")
        if documented.keys() - differing:
            self.fail(
                f"row {row.name}: DOCUMENTED but equal now (out of date): "
                f"{sorted(documented.keys() - differing)}"
            )


def _add_row_test(row):
    def test(self):
        self.compare(row)

    test.__doc__ = f"{row.name}: {' '.join(row.args) or 'no flags'}, {row.nproc} rank(s)"
    setattr(TorchrunConsoleTest, f"test_{row.name}", test)


for _row in ROWS:
    _add_row_test(_row)

if __name__ == "__main__":
    main()
