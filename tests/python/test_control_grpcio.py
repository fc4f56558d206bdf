"""The control plane (issue 13) through a client nobody here wrote: Python's grpcio, with stubs
generated from proto/ at test time, against dlrund's one port. A job's keys are written as its
agents write them, over the TCPStore protocol spoken raw on the same port.

Acceptance 2: a watcher cut off mid-stream reconnects with `since` and sees every event once.
Acceptance 4: with a job token, a call without it or with a wrong one is refused
(UNAUTHENTICATED) and changes nothing; grpc.health.v1 answers SERVING.
"""

import hashlib
import json
import shutil
import unittest

import grpc

from control_stubs import STUB_DIR, health_grpc, health_pb, pb, pb_grpc
from dlrund_fixture import main, start_dlrund
from plain_store import PlainStore

CALL_TIMEOUT_S = 30


class Job:
    """One job's keys (control/state/control_state.h, elastic_protocol.h), as agents write them."""

    def __init__(self, store, job_id, token=""):
        self.store, self.id = store, job_id
        self.root = f"dlrun/{job_id}/"
        token_hash = hashlib.sha256(token.encode()).hexdigest() if token else ""
        store.set(
            self.root + "ctl/meta",
            json.dumps(
                {"backend": "c10d", "min": 1, "max": 1, "max_restarts": 0, "token": token_hash}
            ),
        )
        store.set("dlrun/jobs", job_id + "\n")
        store.set(self.root + "current", "0")
        store.set(self.root + "r/0/closed", "1")

    def publish(self, kind):
        """An event as an agent publishes it: ADD gives its number, then SET writes it."""
        seq = self.store.add(self.root + "ctl/seq", 1)
        self.store.set(
            self.root + f"ctl/ev/{seq}",
            json.dumps(
                {
                    "seq": seq,
                    "time": 1.0,
                    "kind": kind,
                    "node": "n1",
                    "round": 0,
                    "rank": -1,
                    "detail": f"{kind} #{seq}",
                    "agent": 1,
                }
            ),
        )
        return seq

    def finish(self):
        self.store.set(self.root + "r/0/end", json.dumps({"kind": "finished", "node": ""}))


class ControlGrpcioTest(unittest.TestCase):
    def setUp(self):
        self.daemon = start_dlrund(self)
        self.store = PlainStore("127.0.0.1", self.daemon.port)
        self.addCleanup(self.store.close)
        self.target = f"127.0.0.1:{self.daemon.port}"

    def channel(self):
        channel = grpc.insecure_channel(self.target)
        self.addCleanup(channel.close)
        return channel

    def watch(self, channel, job_id, since):
        request = pb.WatchEventsRequest(job=pb.JobRef(id=job_id), since=since, follow=True)
        return pb_grpc.ControlStub(channel).WatchEvents(request, timeout=CALL_TIMEOUT_S)

    def test_a_reconnecting_watcher_sees_every_event_once(self):
        job = Job(self.store, "watched")
        kinds = {}
        for kind in ("round_closed", "worker_started", "worker_started", "worker_started"):
            kinds[job.publish(kind)] = kind

        seen = []
        first = grpc.insecure_channel(self.target)
        stream = self.watch(first, job.id, 0)
        seen += [next(stream), next(stream)]
        for kind in ("worker_exited", "worker_exited"):  # while the first watcher is connected
            kinds[job.publish(kind)] = kind
        first.close()  # cut off mid-stream, its server-side call still waiting
        with self.assertRaises(grpc.RpcError) as cut:
            next(stream)
        self.assertEqual(cut.exception.code(), grpc.StatusCode.CANCELLED)
        for kind in ("restart", "round_closed", "worker_started"):  # while nobody watches
            kinds[job.publish(kind)] = kind

        stream = self.watch(self.channel(), job.id, seen[-1].seq)
        while seen[-1].seq < max(kinds):
            seen.append(next(stream))
        job.finish()
        kinds[job.publish("job_ended")] = "job_ended"
        seen += list(stream)  # the stream ends on its own once the job ended

        self.assertEqual([event.seq for event in seen], list(range(1, len(kinds) + 1)))
        self.assertEqual([event.kind for event in seen], [kinds[event.seq] for event in seen])
        self.assertEqual(seen[4].detail, "worker_exited #5")

    def test_a_job_token_is_required_and_a_refused_call_changes_nothing(self):
        job = Job(self.store, "secure", token="s3cret")
        job.publish("round_closed")
        stub = pb_grpc.ControlStub(self.channel())
        wrong = (("authorization", "Bearer guess"),)
        right = (("authorization", "Bearer s3cret"),)
        stop = pb.StopJobRequest(job=pb.JobRef(id=job.id), reason="refused")
        signal = pb.SignalJobRequest(job=pb.JobRef(id=job.id), signal="USR1")
        for metadata in ((), wrong):
            with self.subTest(metadata=metadata):
                for call, request in (
                    (stub.GetJob, pb.JobRef(id=job.id)),
                    (stub.StopJob, stop),
                    (stub.SignalJob, signal),
                ):
                    with self.assertRaises(grpc.RpcError) as refused:
                        call(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
                    self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                with self.assertRaises(grpc.RpcError) as refused:
                    next(
                        stub.WatchEvents(
                            pb.WatchEventsRequest(job=pb.JobRef(id=job.id)),
                            metadata=metadata,
                            timeout=CALL_TIMEOUT_S,
                        )
                    )
                self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                listed = stub.ListJobs(
                    pb.ListJobsRequest(), metadata=metadata, timeout=CALL_TIMEOUT_S
                )
                self.assertEqual(list(listed.jobs), [])
        # Nothing changed: no stop, no signal, no event beyond the agent's.
        for key in ("stop", "r/0/end", "ctl/signals", "ctl/ev/2"):
            self.assertFalse(self.store.exists(job.root + key), key)

        got = stub.GetJob(pb.JobRef(id=job.id), metadata=right, timeout=CALL_TIMEOUT_S)
        self.assertEqual(got.state, pb.RUNNING)
        stub.StopJob(
            pb.StopJobRequest(job=pb.JobRef(id=job.id), reason="done"),
            metadata=right,
            timeout=CALL_TIMEOUT_S,
        )
        self.assertTrue(self.store.exists(job.root + "stop"))
        got = stub.GetJob(pb.JobRef(id=job.id), metadata=right, timeout=CALL_TIMEOUT_S)
        self.assertEqual(got.state, pb.STOPPED)

    def test_health_answers_serving(self):
        health = health_grpc.HealthStub(self.channel())
        for service in ("", "dlrun.v1.Control"):
            with self.subTest(service=service):
                reply = health.Check(
                    health_pb.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S
                )
                self.assertEqual(reply.status, health_pb.HealthCheckResponse.SERVING)
        with self.assertRaises(grpc.RpcError) as unknown:
            health.Check(
                health_pb.HealthCheckRequest(service="no.such.Service"), timeout=CALL_TIMEOUT_S
            )
        self.assertEqual(unknown.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_store_clients_are_served_beside_grpc(self):
        # After gRPC calls on the port, a TCPStore client still gets answers.
        stub = pb_grpc.ControlStub(self.channel())
        stub.ListJobs(pb.ListJobsRequest(), timeout=CALL_TIMEOUT_S)
        other = PlainStore("127.0.0.1", self.daemon.port)
        self.addCleanup(other.close)
        self.assertEqual(other.add("counter", 2), 2)
        self.assertEqual(self.store.add("counter", 3), 5)


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(STUB_DIR, ignore_errors=True)
