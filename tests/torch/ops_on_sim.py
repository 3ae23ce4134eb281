"""What single-process PyTorch does on the sim, as docs/sim.md's table says: which operations are
exact, which kernels are no-ops, which operations fail.

Run with the sim preloaded (tests/torch/run_torch.sh): python tests/torch/ops_on_sim.py
The sim's private counters (cudasimKernelLaunchCounts in libcuda.so.1) tell a kernel the sim
computed from a no-op one.
"""
import ctypes
import sys

import torch

passed = 0
driver = ctypes.CDLL("libcuda.so.1")  # the sim's, already loaded through LD_PRELOAD


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check(name, got, expected):
    global passed
    if got != expected:
        say(f"rank 0: FAILED {name}: got {got}, expected {expected}")
        sys.exit(1)
    passed += 1
    say(f"rank 0: ok {name}")


def launches():
    computed, noop = ctypes.c_ulonglong(), ctypes.c_ulonglong()
    driver.cudasimKernelLaunchCounts(ctypes.byref(computed), ctypes.byref(noop))
    return computed.value, noop.value


def computed_only(name, make, expected):
    """`make` launches kernels the sim computes (and no no-op kernel); its result is exact."""
    before = launches()
    got = make().cpu().tolist()
    after = launches()
    check(name, got, expected)
    check(f"{name}: computed, no no-op kernel", (after[0] > before[0], after[1] - before[1]),
          (True, 0))


def no_op(name, make):
    """`make` launches a kernel the sim does not run: it completes, and computes nothing."""
    before = launches()
    make().cpu()
    after = launches()
    check(f"{name}: a no-op kernel", after[1] > before[1], True)


def device_and_memory():
    check("cuda available", torch.cuda.is_available(), True)
    check("device count (CUDASIM_DEVICES, default 8)", torch.cuda.device_count() >= 1, True)
    properties = torch.cuda.get_device_properties(0)
    check("compute capability", (properties.major, properties.minor), (9, 0))
    free, total = torch.cuda.mem_get_info()
    check("memory info", 0 < free <= total, True)
    host = torch.tensor([1.5, -2.0, 3.25])
    check("host -> device -> host", host.cuda().cpu().tolist(), [1.5, -2.0, 3.25])
    pinned = torch.tensor([7, 8, 9], dtype=torch.int32).pin_memory()
    check("pinned, non-blocking copy", pinned.cuda(non_blocking=True).cpu().tolist(), [7, 8, 9])
    a = torch.tensor([1.0, 2.0, 3.0, 4.0], device="cuda")
    check("device -> device copy", a.clone().cpu().tolist(), [1.0, 2.0, 3.0, 4.0])
    check("contiguous slice copy", a[1:3].contiguous().cpu().tolist(), [2.0, 3.0])
    check("zeros (a memset)", torch.zeros(3, device="cuda").cpu().tolist(), [0.0] * 3)


def computed_kernels():
    computed_only("ones", lambda: torch.ones(5, device="cuda"), [1.0] * 5)
    computed_only("full int64", lambda: torch.full((3,), 7, dtype=torch.int64, device="cuda"),
                  [7, 7, 7])
    a = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    b = torch.tensor([0.5, 0.25, 4.0], device="cuda")
    computed_only("add", lambda: a + b, [1.5, 2.25, 7.0])
    computed_only("add with alpha", lambda: torch.add(a, b, alpha=-2.0), [0.0, 1.5, -5.0])
    computed_only("add a scalar", lambda: a + 1.0, [2.0, 3.0, 4.0])
    computed_only("mul", lambda: a * b, [0.5, 0.5, 12.0])
    computed_only("mul by a scalar", lambda: a * 3.0, [3.0, 6.0, 9.0])
    computed_only("div", lambda: a / b, [2.0, 8.0, 0.75])
    i = torch.tensor([5, -6], dtype=torch.int64, device="cuda")
    computed_only("int64 add and mul", lambda: (i + i) * 3, [30, -36])

    x = torch.zeros(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1.0)  # warm-up outside the capture, as torch asks
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        x.add_(1.0)
    check("capture records, does not run", x.cpu().tolist(), [1.0] * 4)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    check("graph replays run the captured kernel", x.cpu().tolist(), [3.0] * 4)


def no_op_kernels():
    no_op("arange", lambda: torch.arange(5, device="cuda"))
    no_op("sum (a reduction)", lambda: torch.ones(8, device="cuda").sum())
    no_op("strided mul", lambda: torch.ones(8, device="cuda")[::2] * 3.0)
    no_op("exp", lambda: torch.ones(4, device="cuda").exp())


def failing_operations():
    try:
        torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")
        check("matmul fails (cuBLAS cannot start)", "no error", "CUBLAS_STATUS_NOT_INITIALIZED")
    except RuntimeError as error:
        reason = "CUBLAS_STATUS_NOT_INITIALIZED" if "CUBLAS_STATUS_NOT_INITIALIZED" in str(
            error) else str(error)
        check("matmul fails (cuBLAS cannot start)", reason, "CUBLAS_STATUS_NOT_INITIALIZED")


def main():
    device_and_memory()
    computed_kernels()
    no_op_kernels()
    failing_operations()
    say(f"rank 0: {passed} checks passed")


if __name__ == "__main__":
    main()
