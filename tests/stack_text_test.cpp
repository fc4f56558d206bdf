// Reading stack dumps, on real captured output: eu-stack and gdb on a torch 1.13 gloo worker
// waiting in all_reduce and on its peer sleeping before it, on dlrun-train waiting in its
// shared-memory and gloo all-reduces; faulthandler on the same torch workers and on a threaded
// script; a flight recorder dump shaped as PyTorch 2.x writes it, pickled by Python.
#include "agents/stack_text.h"

#include <gtest/gtest.h>

namespace dlrun::agents {
namespace {

using Frames = std::vector<std::string>;

// eu-stack -p on rank 0 of a 2-rank gloo job, waiting in dist.all_reduce.
constexpr std::string_view kEuStackGlooWaiting = R"(PID 21409 - process
TID 21409:
#0  0x00007ff5d91dbf16 __futex_abstimed_wait_common
#1  0x00007ff5d91de5d8 pthread_cond_wait@@GLIBC_2.3.2
#2  0x00007ff5d4cc2843 c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)
#3  0x00007ff5d85a9b4e
#4  0x00007ff5d7f09a31
#5  0x0000000000547b96
#6  0x0000000000517fc3 _PyObject_MakeTpCall
#7  0x000000000052b9e0 _PyEval_EvalFrameDefault
#8  0x00000000005236bb PyEval_EvalCode
#9  0x0000000000647d97
#10 0x00000000006456ef
#11 0x0000000000651770
#12 0x00000000006514bb _PyRun_SimpleFileObject
#13 0x00000000006512e4 _PyRun_AnyFileObject
#14 0x000000000065007f Py_RunMain
#15 0x0000000000627d37 Py_BytesMain
#16 0x00007ff5d917d24a __libc_start_call_main
#17 0x00007ff5d917d305 __libc_start_main@@GLIBC_2.34
#18 0x0000000000627bd1 _start
TID 21441:
#0  0x00007ff5d925226f __poll
#1  0x00007ff5d4c7e8f3
#2  0x00007ff5d00d44a3
#3  0x00007ff5d91df1f5 start_thread
#4  0x00007ff5d925f8ec __clone3
TID 21447:
#0  0x00007ff5d925ef36 epoll_wait
#1  0x00007ff5cff1decf gloo::transport::tcp::Loop::run()
#2  0x00007ff5d00d44a3
#3  0x00007ff5d91df1f5 start_thread
#4  0x00007ff5d925f8ec __clone3
TID 21449:
#0  0x00007ff5d91dbf16 __futex_abstimed_wait_common
#1  0x00007ff5d91debaf pthread_cond_clockwait@GLIBC_2.30
#2  0x00007ff5cff2bd6b gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, std::ratio<1l, 1000l> >)
#3  0x00007ff5cfefb8f7
#4  0x00007ff5d4c6ceb5
#5  0x00007ff5d4c6c8ad c10d::ProcessGroupGloo::AsyncWork::execute(c10::intrusive_ptr<c10d::ProcessGroupGloo::AsyncWork, c10::detail::intrusive_target_default_null_type<c10d::ProcessGroupGloo::AsyncWork> >)
#6  0x00007ff5d4c6c9d4 c10d::ProcessGroupGloo::runLoop(int)
#7  0x00007ff5d00d44a3
#8  0x00007ff5d91df1f5 start_thread
#9  0x00007ff5d925f8ec __clone3
TID 21450:
#0  0x00007ff5d91dbf16 __futex_abstimed_wait_common
#1  0x00007ff5d91de5d8 pthread_cond_wait@@GLIBC_2.3.2
#2  0x00007ff5d4c6cac1 c10d::ProcessGroupGloo::runLoop(int)
#3  0x00007ff5d00d44a3
#4  0x00007ff5d91df1f5 start_thread
#5  0x00007ff5d925f8ec __clone3
)";

// eu-stack -p on rank 1 of that job, in time.sleep before its all_reduce: gloo's and
// ProcessGroupGloo's idle threads are there all the same.
constexpr std::string_view kEuStackGlooSleeping = R"(PID 21410 - process
TID 21410:
#0  0x00007fa1e6d17545 clock_nanosleep@GLIBC_2.2.5
#1  0x00000000005d64b4
#2  0x0000000000545963
#3  0x000000000053acbc PyObject_Vectorcall
#4  0x000000000052b9e0 _PyEval_EvalFrameDefault
#5  0x00000000005236bb PyEval_EvalCode
#6  0x0000000000647d97
#7  0x00000000006456ef
#8  0x0000000000651770
#9  0x00000000006514bb _PyRun_SimpleFileObject
#10 0x00000000006512e4 _PyRun_AnyFileObject
#11 0x000000000065007f Py_RunMain
#12 0x0000000000627d37 Py_BytesMain
#13 0x00007fa1e6c6f24a __libc_start_call_main
#14 0x00007fa1e6c6f305 __libc_start_main@@GLIBC_2.34
#15 0x0000000000627bd1 _start
TID 21444:
#0  0x00007fa1e6d4426f __poll
#1  0x00007fa1e2880c61
#2  0x00007fa1ddcd44a3
#3  0x00007fa1e6cd11f5 start_thread
#4  0x00007fa1e6d518ec __clone3
TID 21445:
#0  0x00007fa1e6d50f36 epoll_wait
#1  0x00007fa1dc5caecf gloo::transport::tcp::Loop::run()
#2  0x00007fa1ddcd44a3
#3  0x00007fa1e6cd11f5 start_thread
#4  0x00007fa1e6d518ec __clone3
TID 21451:
#0  0x00007fa1e6ccdf16 __futex_abstimed_wait_common
#1  0x00007fa1e6cd05d8 pthread_cond_wait@@GLIBC_2.3.2
#2  0x00007fa1e286cac1 c10d::ProcessGroupGloo::runLoop(int)
#3  0x00007fa1ddcd44a3
#4  0x00007fa1e6cd11f5 start_thread
#5  0x00007fa1e6d518ec __clone3
)";

// gdb -batch -p ... -ex "thread apply all bt" on the waiting rank 0 (some threads left out).
constexpr std::string_view kGdbGlooWaiting = R"([New LWP 21441]
[New LWP 21449]
[Thread debugging using libthread_db enabled]
Using host libthread_db library "/lib/x86_64-linux-gnu/libthread_db.so.1".
__futex_abstimed_wait_common64 (private=0, cancel=true, abstime=0x0, op=393, expected=0, futex_word=0x299e4278) at ./nptl/futex-internal.c:57

Thread 6 (Thread 0x7ff5b4d1f6c0 (LWP 21450) "python3"):
#0  __futex_abstimed_wait_common64 (private=0, cancel=true, abstime=0x0, op=393, expected=0, futex_word=0x2aa40928) at ./nptl/futex-internal.c:57
#1  __futex_abstimed_wait_common (futex_word=futex_word@entry=0x2aa40928, expected=expected@entry=0, clockid=clockid@entry=0, abstime=abstime@entry=0x0, private=private@entry=0, cancel=cancel@entry=true) at ./nptl/futex-internal.c:87
#2  0x00007ff5d91dbf7b in __GI___futex_abstimed_wait_cancelable64 (futex_word=futex_word@entry=0x2aa40928, expected=expected@entry=0, clockid=clockid@entry=0, abstime=abstime@entry=0x0, private=private@entry=0) at ./nptl/futex-internal.c:139
#3  0x00007ff5d91de5d8 in __pthread_cond_wait_common (abstime=0x0, clockid=0, mutex=0x2aa408d8, cond=0x2aa40900) at ./nptl/pthread_cond_wait.c:503
#4  ___pthread_cond_wait (cond=0x2aa40900, mutex=0x2aa408d8) at ./nptl/pthread_cond_wait.c:618
#5  0x00007ff5d4c6cac1 in c10d::ProcessGroupGloo::runLoop(int) () from /lib/x86_64-linux-gnu/libtorch_cpu.so.1.13
#6  0x00007ff5d00d44a3 in ?? () from /lib/x86_64-linux-gnu/libstdc++.so.6
#7  0x00007ff5d91df1f5 in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442
#8  0x00007ff5d925f8ec in clone3 () at ../sysdeps/unix/sysv/linux/x86_64/clone3.S:81

Thread 5 (Thread 0x7ff5b55206c0 (LWP 21449) "python3"):
#0  __futex_abstimed_wait_common64 (private=0, cancel=true, abstime=0x7ff5b551f840, op=137, expected=0, futex_word=0x7ff5ac000db8) at ./nptl/futex-internal.c:57
#1  __futex_abstimed_wait_common (futex_word=futex_word@entry=0x7ff5ac000db8, expected=expected@entry=0, clockid=clockid@entry=1, abstime=abstime@entry=0x7ff5b551f840, private=private@entry=0, cancel=cancel@entry=true) at ./nptl/futex-internal.c:87
#2  0x00007ff5d91dbf7b in __GI___futex_abstimed_wait_cancelable64 (futex_word=futex_word@entry=0x7ff5ac000db8, expected=expected@entry=0, clockid=clockid@entry=1, abstime=abstime@entry=0x7ff5b551f840, private=private@entry=0) at ./nptl/futex-internal.c:139
#3  0x00007ff5d91debaf in __pthread_cond_wait_common (abstime=<optimized out>, clockid=1, mutex=0x7ff5ac000d68, cond=0x7ff5ac000d90) at ./nptl/pthread_cond_wait.c:503
#4  ___pthread_cond_clockwait64 (abstime=<optimized out>, clockid=1, mutex=0x7ff5ac000d68, cond=0x7ff5ac000d90) at ./nptl/pthread_cond_wait.c:682
#5  ___pthread_cond_clockwait64 (cond=0x7ff5ac000d90, mutex=0x7ff5ac000d68, clockid=1, abstime=<optimized out>) at ./nptl/pthread_cond_wait.c:670
#6  0x00007ff5cff2bd6b in gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, std::ratio<1l, 1000l> >) () from /lib/libgloo.so.0
#7  0x00007ff5cfefb8f7 in ?? () from /lib/libgloo.so.0
#8  0x00007ff5d4c6ceb5 in ?? () from /lib/x86_64-linux-gnu/libtorch_cpu.so.1.13
#9  0x00007ff5d4c6c8ad in c10d::ProcessGroupGloo::AsyncWork::execute(c10::intrusive_ptr<c10d::ProcessGroupGloo::AsyncWork, c10::detail::intrusive_target_default_null_type<c10d::ProcessGroupGloo::AsyncWork> >) () from /lib/x86_64-linux-gnu/libtorch_cpu.so.1.13
#10 0x00007ff5d4c6c9d4 in c10d::ProcessGroupGloo::runLoop(int) () from /lib/x86_64-linux-gnu/libtorch_cpu.so.1.13
#11 0x00007ff5d00d44a3 in ?? () from /lib/x86_64-linux-gnu/libstdc++.so.6
#12 0x00007ff5d91df1f5 in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442
#13 0x00007ff5d925f8ec in clone3 () at ../sysdeps/unix/sysv/linux/x86_64/clone3.S:81

Thread 1 (Thread 0x7ff5d9155040 (LWP 21409) "python3"):
#0  __futex_abstimed_wait_common64 (private=0, cancel=true, abstime=0x0, op=393, expected=0, futex_word=0x299e4278) at ./nptl/futex-internal.c:57
#1  __futex_abstimed_wait_common (futex_word=futex_word@entry=0x299e4278, expected=expected@entry=0, clockid=clockid@entry=0, abstime=abstime@entry=0x0, private=private@entry=0, cancel=cancel@entry=true) at ./nptl/futex-internal.c:87
#2  0x00007ff5d91dbf7b in __GI___futex_abstimed_wait_cancelable64 (futex_word=futex_word@entry=0x299e4278, expected=expected@entry=0, clockid=clockid@entry=0, abstime=abstime@entry=0x0, private=private@entry=0) at ./nptl/futex-internal.c:139
#3  0x00007ff5d91de5d8 in __pthread_cond_wait_common (abstime=0x0, clockid=0, mutex=0x299e4228, cond=0x299e4250) at ./nptl/pthread_cond_wait.c:503
#4  ___pthread_cond_wait (cond=0x299e4250, mutex=0x299e4228) at ./nptl/pthread_cond_wait.c:618
#5  0x00007ff5d4cc2843 in c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >) () from /lib/x86_64-linux-gnu/libtorch_cpu.so.1.13
#6  0x00007ff5d85a9b4e in ?? () from /lib/x86_64-linux-gnu/libtorch_python.so.1.13
#7  0x00007ff5d7f09a31 in ?? () from /lib/x86_64-linux-gnu/libtorch_python.so.1.13
#8  0x0000000000547b96 in ?? ()
#9  0x0000000000517fc3 in _PyObject_MakeTpCall ()
#10 0x000000000052b9e0 in _PyEval_EvalFrameDefault ()
#11 0x00000000005236bb in PyEval_EvalCode ()
#12 0x0000000000647d97 in ?? ()
#13 0x00000000006456ef in ?? ()
#14 0x0000000000651770 in ?? ()
#15 0x00000000006514bb in _PyRun_SimpleFileObject ()
#16 0x00000000006512e4 in _PyRun_AnyFileObject ()
#17 0x000000000065007f in Py_RunMain ()
#18 0x0000000000627d37 in Py_BytesMain ()
#19 0x00007ff5d917d24a in __libc_start_call_main (main=main@entry=0x627ca0, argc=argc@entry=2, argv=argv@entry=0x7ffdee15cd38) at ../sysdeps/nptl/libc_start_call_main.h:58
#20 0x00007ff5d917d305 in __libc_start_main_impl (main=0x627ca0, argc=2, argv=0x7ffdee15cd38, init=<optimized out>, fini=<optimized out>, rtld_fini=<optimized out>, stack_end=0x7ffdee15cd28) at ../csu/libc-start.c:360
#21 0x0000000000627bd1 in _start ()
[Inferior 1 (process 21409) detached]
)";

// faulthandler (the hook's dump) of the same two ranks.
constexpr std::string_view kPythonGlooWaiting =
    R"(Current thread 0x00007ff5d9155040 (most recent call first):
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 1541 in all_reduce
  File "/tmp/stk/gloo_hang.py", line 11 in main
  File "/tmp/stk/gloo_hang.py", line 12 in <module>
)";
constexpr std::string_view kPythonGlooSleeping =
    R"(Current thread 0x00007fa1e6c47040 (most recent call first):
  File "/tmp/stk/gloo_hang.py", line 4 in sleeping_rank_sleeps_here
  File "/tmp/stk/gloo_hang.py", line 9 in main
  File "/tmp/stk/gloo_hang.py", line 12 in <module>
)";

// faulthandler of a script whose main thread and a threading.Thread both sleep.
constexpr std::string_view kPythonThreads = R"(Thread 0x00007fbbdc0e06c0 (most recent call first):
  File "/tmp/stk/thr.py", line 3 in helper_thread_waits
  File "/usr/lib/python3.11/threading.py", line 975 in run
  File "/usr/lib/python3.11/threading.py", line 1038 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap

Current thread 0x00007fbbdc39b040 (most recent call first):
  File "/tmp/stk/thr.py", line 6 in main_waits
  File "/tmp/stk/thr.py", line 8 in <module>
)";

// eu-stack and gdb on rank 0 of `dlrun --nproc-per-node 2 train` while rank 1 is stopped:
// the shared-memory all-reduce's barrier.
constexpr std::string_view kEuStackTrainer = R"(PID 384 - process
TID 384:
#0  0x00007fe504f1f829 syscall
#1  0x000055e35d1a7eec dlrun::trainer::(anonymous namespace)::SharedMemoryCollective::barrier()
#2  0x000055e35d1a8004 dlrun::trainer::(anonymous namespace)::SharedMemoryCollective::allreduceSum(float*, unsigned long)
#3  0x000055e35d1ac7d4 dlrun::trainer::(anonymous namespace)::CpuEngine::step(float const*, unsigned char const*, int, float, bool)
#4  0x000055e35d18e7d7 dlrun::trainer::train(dlrun::trainer::TrainConfig const&, dlrun::trainer::Placement const&)
#5  0x000055e35d161fe0 main::{lambda()#1}::operator()() const [clone .isra.0]
#6  0x000055e35d1c9410 dlrun::guardedMain(std::function<int ()> const&)
#7  0x000055e35d160414 main
#8  0x00007fe504e4524a __libc_start_call_main
#9  0x00007fe504e45305 __libc_start_main@@GLIBC_2.34
#10 0x000055e35d161be1 _start
)";
constexpr std::string_view kGdbTrainer = R"(
Thread 1 (Thread 0x7fe504b8a740 (LWP 384) "dlrun-train"):
#0  syscall () at ../sysdeps/unix/sysv/linux/x86_64/syscall.S:38
#1  0x000055e35d1a7eec in dlrun::trainer::(anonymous namespace)::SharedMemoryCollective::barrier() ()
#2  0x000055e35d1a8004 in dlrun::trainer::(anonymous namespace)::SharedMemoryCollective::allreduceSum(float*, unsigned long) ()
#3  0x000055e35d1ac7d4 in dlrun::trainer::(anonymous namespace)::CpuEngine::step(float const*, unsigned char const*, int, float, bool) ()
#4  0x000055e35d18e7d7 in dlrun::trainer::train(dlrun::trainer::TrainConfig const&, dlrun::trainer::Placement const&) ()
#5  0x000055e35d161fe0 in main::{lambda()#1}::operator()() const [clone .isra.0] ()
#6  0x000055e35d1c9410 in dlrun::guardedMain(std::function<int ()> const&) ()
#7  0x000055e35d160414 in main ()
[Inferior 1 (process 384) detached]
)";

// eu-stack on rank 0 of `dlrun --nproc-per-node 2 train --allreduce gloo`, rank 1 stopped.
constexpr std::string_view kEuStackTrainerGloo = R"(PID 506 - process
TID 506:
#0  0x00007f520eca3f16 __futex_abstimed_wait_common
#1  0x00007f520eca6baf pthread_cond_clockwait@GLIBC_2.30
#2  0x00007f521aa59d6b gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, std::ratio<1l, 1000l> >)
#3  0x00007f521aa29a15
#4  0x0000564d077c9958 dlrun::trainer::(anonymous namespace)::GlooCollective::allreduceSum(float*, unsigned long)
#5  0x0000564d077dd7d4 dlrun::trainer::(anonymous namespace)::CpuEngine::step(float const*, unsigned char const*, int, float, bool)
#6  0x0000564d077bf7d7 dlrun::trainer::train(dlrun::trainer::TrainConfig const&, dlrun::trainer::Placement const&)
#7  0x0000564d07792fe0 main::{lambda()#1}::operator()() const [clone .isra.0]
#8  0x0000564d077fa410 dlrun::guardedMain(std::function<int ()> const&)
#9  0x0000564d07791414 main
#10 0x00007f520ec4524a __libc_start_call_main
#11 0x00007f520ec45305 __libc_start_main@@GLIBC_2.34
#12 0x0000564d07792be1 _start
TID 508:
#0  0x00007f520ed26f36 epoll_wait
#1  0x00007f521aa4becf gloo::transport::tcp::Loop::run()
#2  0x00007f520ead44a3
#3  0x00007f520eca71f5 start_thread
#4  0x00007f520ed278ec __clone3
)";

// pickle.dumps(protocol=2) of a dict laid out as PyTorch 2.x's flight recorder dumps it
// (version 2.2: record_id, collective_seq_id, profiling_name "nccl:...", state, frames, ...),
// with three entries: broadcast #1 and all_reduce #2 completed, all_reduce #3 started. Keys
// and the repeated name come back as memo references (BINGET), as in torch's own pickler.
constexpr std::string_view kFlightRecorderHex =
    "80027d710028580700000076657273696f6e71015803000000322e327102580900000070675f636f6e66696771037d"
    "71"
    "0458010000003071057d71062858040000006e616d65710768055804000000646573637108580a0000006465666175"
    "6c"
    "745f70677109580500000072616e6b73710a58060000005b302c20315d710b75735807000000656e7472696573710c"
    "5d"
    "710d287d710e2858090000007265636f72645f6964710f4b00580500000070675f696471104b00580d00000070726f"
    "63"
    "6573735f67726f75707111680568098671125811000000636f6c6c6563746976655f7365715f696471134b01580a00"
    "00"
    "007032705f7365715f696471144b0058050000006f705f696471154b01580e00000070726f66696c696e675f6e616d"
    "65"
    "7116580e0000006e63636c3a62726f6164636173747117580f00000074696d655f637265617465645f6e7371188a08"
    "87"
    "4b95935279c317580b000000696e7075745f73697a657371195d711a5d711b4d00046161580c000000696e7075745f"
    "64"
    "7479706573711c5d711d5805000000466c6f6174711e61580c0000006f75747075745f73697a6573711f5d71205d71"
    "21"
    "4d00046161580d0000006f75747075745f64747970657371225d7123681e6158050000007374617465712458090000"
    "00"
    "636f6d706c657465647125581a00000074696d655f646973636f76657265645f737461727465645f6e7371264e581c"
    "00"
    "000074696d655f646973636f76657265645f636f6d706c657465645f6e7371274e5807000000726574697265647128"
    "88"
    "580a00000074696d656f75745f6d7371294ac0270900580600000069735f703270712a8958060000006672616d6573"
    "71"
    "2b5d712c7d712d286807580a000000616c6c5f726564756365712e580800000066696c656e616d65712f5808000000"
    "74"
    "7261696e2e7079713058040000006c696e6571314b0c7561757d713228680f4b0168104b006811681268134b026814"
    "4b"
    "0068154b026816580f0000006e63636c3a616c6c5f726564756365713368188a08884b95935279c31768195d71345d"
    "71"
    "354d00046161681c5d7136681e61681f5d71375d71384d0004616168225d7139681e616824682568264e68274e6828"
    "88"
    "68294ac0270900682a89682b5d713a7d713b286807682e682f683068314b0c7561757d713c28680f4b0268104b0068"
    "11"
    "681268134b0368144b0068154b036816683368188a08894b95935279c31768195d713d5d713e4d00046161681c5d71"
    "3f"
    "681e61681f5d71405d71414d0004616168225d7142681e616824580700000073746172746564714368264e68274e68"
    "28"
    "8968294ac0270900682a89682b5d71447d7145286807682e682f683068314b0c75617565752e";

std::string fromHex(std::string_view hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return bytes;
}

TEST(StackTextTest, EuStackThreadsAndFrames) {
  const auto threads = parseEuStack(kEuStackGlooWaiting, 21409);
  ASSERT_EQ(threads.size(), 5u);
  EXPECT_TRUE(threads[0].main);
  EXPECT_FALSE(threads[1].main);
  ASSERT_EQ(threads[0].frames.size(), 19u);
  EXPECT_EQ(threads[0].frames[1].function, "pthread_cond_wait");  // the symbol version goes
  EXPECT_EQ(threads[0].frames[3].function, "");                   // no symbol
  EXPECT_EQ(threads[3].frames[2].function,
            "gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, "
            "std::ratio<1l, 1000l> >)");
}

TEST(StackTextTest, GdbThreadsAndFrames) {
  const auto threads = parseGdbBacktrace(kGdbGlooWaiting, 21409);
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_FALSE(threads[0].main);
  EXPECT_TRUE(threads[2].main);  // "Thread 1 (... (LWP 21409) ...)"
  ASSERT_EQ(threads[2].frames.size(), 22u);
  // With and without "0x... in", with and without debug information, "??".
  EXPECT_EQ(threads[2].frames[0].function, "__futex_abstimed_wait_common64");
  EXPECT_EQ(threads[2].frames[3].function, "__pthread_cond_wait_common");
  EXPECT_EQ(threads[2].frames[5].function,
            "c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)");
  EXPECT_EQ(threads[2].frames[6].function, "");
  EXPECT_EQ(threads[2].frames[9].function, "_PyObject_MakeTpCall");

  const auto trainer = parseGdbBacktrace(kGdbTrainer, 384);
  ASSERT_EQ(trainer.size(), 1u);
  EXPECT_EQ(trainer[0].frames[1].function,
            "dlrun::trainer::(anonymous namespace)::SharedMemoryCollective::barrier()");
}

TEST(StackTextTest, FaulthandlerThreadsAndFrames) {
  const auto threads = parseFaulthandler(kPythonThreads);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_FALSE(threads[0].main);
  EXPECT_TRUE(threads[1].main);  // its outermost frame is the script's <module>
  ASSERT_EQ(threads[0].frames.size(), 4u);
  EXPECT_EQ(threads[0].frames[0].function, "helper_thread_waits");
  EXPECT_EQ(threads[0].frames[0].file, "/tmp/stk/thr.py");
  EXPECT_EQ(threads[0].frames[0].line, 3);
  EXPECT_EQ(threads[1].frames[1].function, "<module>");
}

TEST(StackTextTest, TheRankWaitingInAllReduceAndItsSleepingPeer) {
  const auto waiting = findCollective(parseFaulthandler(kPythonGlooWaiting),
                                      parseEuStack(kEuStackGlooWaiting, 21409));
  EXPECT_EQ(waiting, "all_reduce");
  // The sleeping rank has gloo's and ProcessGroupGloo's idle threads, and waits in nothing.
  EXPECT_EQ(findCollective(parseFaulthandler(kPythonGlooSleeping),
                           parseEuStack(kEuStackGlooSleeping, 21410)),
            std::nullopt);
  EXPECT_EQ(topFrames(parseFaulthandler(kPythonGlooSleeping), {}, 2),
            (Frames{"sleeping_rank_sleeps_here (gloo_hang.py:4)", "main (gloo_hang.py:9)"}));
}

TEST(StackTextTest, NativeStacksAloneShowTheWaitOnACollectivesWork) {
  // Without Python stacks (a C++ torch program, or no hook) the work's wait still shows.
  EXPECT_EQ(findCollective({}, parseEuStack(kEuStackGlooWaiting, 21409)), "c10d::Work::wait");
  // The main thread's wait comes first, whatever the order of the threads in the text.
  EXPECT_EQ(findCollective({}, parseGdbBacktrace(kGdbGlooWaiting, 21409)), "c10d::Work::wait");
  EXPECT_EQ(findCollective({}, parseEuStack(kEuStackGlooSleeping, 21410)), std::nullopt);
}

TEST(StackTextTest, TheBundledTrainersAllReduce) {
  EXPECT_EQ(findCollective({}, parseEuStack(kEuStackTrainer, 384)), "all_reduce");
  EXPECT_EQ(findCollective({}, parseGdbBacktrace(kGdbTrainer, 384)), "all_reduce");
  EXPECT_EQ(findCollective({}, parseEuStack(kEuStackTrainerGloo, 506)), "all_reduce");
  EXPECT_EQ(
      topFrames({}, parseEuStack(kEuStackTrainer, 384), 3),
      (Frames{"syscall", "dlrun::trainer::(anonymous namespace)::SharedMemoryCollective::barrier",
              "dlrun::trainer::(anonymous namespace)::SharedMemoryCollective::allreduceSum"}));
}

TEST(StackTextTest, NativeOpsByName) {
  const auto one = [](std::string function) {
    return findCollective(
        {}, {StackThread{.main = true, .frames = {{.function = std::move(function)}}}});
  };
  EXPECT_EQ(one("ncclAllReduce"), "all_reduce");
  EXPECT_EQ(one("ncclReduceScatter"), "reduce_scatter");
  EXPECT_EQ(one("ncclBcast"), "broadcast");
  EXPECT_EQ(one("gloo::allgather(gloo::AllgatherOptions&)"), "all_gather");
  EXPECT_EQ(one("gloo::BarrierAllToOne::run()"), "barrier");
  EXPECT_EQ(one("c10d::ProcessGroupGloo::AsyncBroadcastWork::run()"), "broadcast");
  EXPECT_EQ(one("c10d::ProcessGroupNCCL::WorkNCCL::synchronizeInternal(std::chrono::duration<long, "
                "std::ratio<1l, 1000l> >)"),
            "c10d::ProcessGroupNCCL::WorkNCCL::synchronizeInternal");
  // Threads every NCCL or gloo process keeps.
  EXPECT_EQ(one("ncclProxyProgress(void*)"), std::nullopt);
  EXPECT_EQ(one("c10d::ProcessGroupNCCL::ncclCommWatchdog()"), std::nullopt);
  EXPECT_EQ(one("gloo::transport::tcp::Loop::run()"), std::nullopt);
}

TEST(StackTextTest, PythonFramesNameTheOpBeforeNativeOnes) {
  // A rank in barrier(): Python says barrier, though gloo's worker runs an all-reduce for it.
  const auto python = parseFaulthandler(R"(Current thread 0x1 (most recent call first):
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 2786 in barrier
  File "/work/train.py", line 40 in <module>
)");
  const std::vector<StackThread> native = {
      {.frames = {{.function = "c10d::ProcessGroupGloo::AsyncAllreduceWork::run()"}}}};
  EXPECT_EQ(findCollective(python, native), "barrier");
  // A function of the same name elsewhere is not torch's.
  const auto own = parseFaulthandler(R"(Current thread 0x1 (most recent call first):
  File "/work/mylib.py", line 3 in all_reduce
  File "/work/train.py", line 40 in <module>
)");
  EXPECT_EQ(findCollective(own, {}), std::nullopt);
}

TEST(StackTextTest, TopFramesPreferPythonsMainThread) {
  const auto python = parseFaulthandler(kPythonThreads);
  const auto native = parseEuStack(kEuStackGlooSleeping, 21410);
  EXPECT_EQ(topFrames(python, native, 5), (Frames{"main_waits (thr.py:6)", "<module> (thr.py:8)"}));
  // Native names without their parameter lists, frames without a symbol skipped.
  EXPECT_EQ(topFrames({}, parseEuStack(kEuStackGlooWaiting, 21409), 4),
            (Frames{"__futex_abstimed_wait_common", "pthread_cond_wait", "c10d::Work::wait",
                    "_PyObject_MakeTpCall"}));
}

TEST(StackTextTest, TheFlightRecordersNewestEntry) {
  EXPECT_EQ(lastFlightRecorderCollective(fromHex(kFlightRecorderHex)),
            "all_reduce (seq 3, started)");
}

TEST(StackTextTest, NoEntryInWhatIsNotAFlightRecorderDump) {
  EXPECT_EQ(lastFlightRecorderCollective(""), std::nullopt);
  EXPECT_EQ(lastFlightRecorderCollective("not a pickle"), std::nullopt);
  // Cut in the second entry, before its name: the first entry is the newest whole one.
  const std::string dump = fromHex(kFlightRecorderHex);
  EXPECT_EQ(lastFlightRecorderCollective(dump.substr(0, dump.size() / 2)),
            "broadcast (seq 1, completed)");
}

}  // namespace
}  // namespace dlrun::agents
