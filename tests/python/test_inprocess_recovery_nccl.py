"""In-process recovery on NCCL (issue 55), for a machine with a CUDA device; run by
scripts/gpu_check.sh. The job of test_inprocess_recovery.py (workers/inprocess_train.py) with
INPROCESS_BACKEND=nccl: its model and data on CUDA, its group NCCL's. Four ranks share the
devices there are (one GPU is enough: each rank is a host of its own to NCCL, and they talk
through sockets on loopback).

- A worker SIGKILLed mid-training (rank 2, its replacement a new interpreter; rank 0, forked from
  the warm start's): the survivors keep their processes and their CUDA contexts (their PIDs
  never change), each rank takes every step once, and every rank's final parameters are, bit
  for bit, those of the fault-free run on NCCL.
- A failure after the group re-formed: a second recovery, generation 2, the same weights.

Exits with code 77 (ctest's skip) where no CUDA device is usable, torch has no NCCL or cannot
abort an NCCL group (torch 2.5 can): scripts/gpu_check.sh counts that as a failure.
"""

import sys

import test_inprocess_recovery as recovery
from dlrun_fixture import main

SKIPPED = 77


class NcclRecoveryTest(recovery.InProcessCase):
    job_env = {"INPROCESS_BACKEND": "nccl", "NCCL_SOCKET_IFNAME": "lo"}

    def test_a_killed_worker_is_replaced_and_the_survivors_go_on(self):
        for victim, warm in ((2, False), (0, True)):
            with self.subTest(victim=victim, warm=warm):
                out, finals, result = self.job(f"{victim}:9", warm=warm)
                self.check_recovered(out, finals, result, victim)
                for line in result.stderr.splitlines():
                    if "recovered in process" in line:
                        print(line)  # the phases, for the GPU figures

    def test_a_failure_after_the_group_re_formed_is_recovered_in_process_again(self):
        out, finals, result = self.job("2:9", "1:15")
        self.assertEqual({f["sha256"] for f in finals}, {self.reference()}, result)
        for rank in range(recovery.WORLD):
            self.assertEqual(finals[rank]["generation"], 2, finals[rank])
            self.assertEqual(len(self.processes(out, rank)), 2 if rank in (1, 2) else 1, rank)


def why_not():
    """Why this machine cannot run the file, or None."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return "no usable CUDA device"
    if not dist.is_nccl_available():
        return f"torch {torch.__version__} has no NCCL"
    if not hasattr(dist.distributed_c10d, "_abort_process_group"):
        return f"torch {torch.__version__} cannot abort an NCCL group"
    return None


if __name__ == "__main__":
    reason = why_not()
    if reason:
        print(f"test_inprocess_recovery_nccl: skipped: {reason}")
        sys.exit(SKIPPED)
    main()
