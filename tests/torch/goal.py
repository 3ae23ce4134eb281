"""Unmodified PyTorch on the sim: the distributed calls a data-parallel job makes, checked exactly.

Run under the real launcher with the sim preloaded (tests/torch/run_torch.sh does this):
    torchrun --nproc_per_node=4 tests/torch/goal.py
Every check prints one line; the last line of each rank is "rank R: N checks passed". Tensors
are made from host data and read back with .cpu(), so the results depend only on copies, NCCL
and the elementwise kernels the sim computes (fill, add, mul, div; docs/sim.md).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
passed = 0


def say(line):
    # One write per line: the ranks share the launcher's output.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check(name, got, expected):
    global passed
    if got != expected:
        say(f"rank {RANK}: FAILED {name}: got {got}, expected {expected}")
        sys.exit(1)
    passed += 1
    say(f"rank {RANK}: ok {name}")


def values(tensor):
    return tensor.cpu().tolist()


def collectives():
    base = [float(RANK + 1), 2.0 * (RANK + 1), -3.0 * (RANK + 1)]
    t = torch.tensor(base, device="cuda")
    dist.all_reduce(t)
    total = WORLD * (WORLD + 1) / 2
    check("all_reduce sum", values(t), [total, 2 * total, -3 * total])

    t = torch.tensor([float(RANK), float(-RANK)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce max", values(t), [float(WORLD - 1), 0.0])

    t = torch.tensor([10 * RANK + i for i in range(5)], dtype=torch.int64, device="cuda")
    dist.broadcast(t, src=1)
    check("broadcast from rank 1", values(t), [10 + i for i in range(5)])

    mine = torch.tensor([100.0 * RANK + i for i in range(3)], device="cuda")
    gathered = torch.empty(3 * WORLD, device="cuda")
    dist.all_gather_into_tensor(gathered, mine)
    check("all_gather_into_tensor", values(gathered),
          [100.0 * r + i for r in range(WORLD) for i in range(3)])

    source = torch.tensor([1000.0 * RANK + j for j in range(2 * WORLD)], device="cuda")
    scattered = torch.empty(2, device="cuda")
    dist.reduce_scatter_tensor(scattered, source)
    expected = [sum(1000.0 * r for r in range(WORLD)) + WORLD * (2 * RANK + k) for k in range(2)]
    check("reduce_scatter_tensor", values(scattered), expected)

    ones = torch.ones(4, device="cuda")
    work = dist.all_reduce(ones, async_op=True)
    work.wait()  # the current stream waits for the collective; the host does not
    torch.cuda.current_stream().synchronize()
    check("async all_reduce completes", (work.is_completed(), values(ones)), (True, [float(WORLD)] * 4))
    dist.barrier()
    check("barrier", True, True)


def subgroups():
    # Every rank creates every group, as torch requires; only members use one.
    evens = dist.new_group([r for r in range(WORLD) if r % 2 == 0])
    odds = dist.new_group([r for r in range(WORLD) if r % 2 == 1])
    mine = evens if RANK % 2 == 0 else odds
    members = [r for r in range(WORLD) if r % 2 == RANK % 2]
    t = torch.tensor([float(RANK)], device="cuda")
    dist.all_reduce(t, group=mine)
    check("new_group all_reduce", values(t), [float(sum(members))])
    out = torch.empty(len(members), device="cuda")
    dist.all_gather_into_tensor(out, torch.tensor([float(RANK)], device="cuda"), group=mine)
    check("new_group all_gather", values(out), [float(r) for r in members])


def streams_and_events():
    # A side stream, stream-ordered hand-over through events, and the caching allocator's
    # record_stream: the tensor made on the default stream is reduced on the side stream.
    side = torch.cuda.Stream()
    t = torch.tensor([float(RANK + 1)] * 8, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(t)
        t.record_stream(side)
        done = torch.cuda.Event()
        done.record(side)
    torch.cuda.current_stream().wait_event(done)
    done.synchronize()
    check("all_reduce on a side stream", values(t), [WORLD * (WORLD + 1) / 2] * 8)
    del t  # freed while the side stream may still use it: record_stream keeps it alive
    check("memory reserved by the caching allocator", torch.cuda.memory_reserved() > 0, True)


class Scale(nn.Module):
    """y = w * x: its gradient (x) needs only the elementwise kernels the sim computes."""

    def __init__(self, size):
        super().__init__()
        self.w = nn.Parameter(torch.ones(size))

    def forward(self, x):
        return self.w * x


def data_parallel(steps=3, size=6, lr=0.5):
    model = Scale(size).cuda()
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[LOCAL_RANK])
    w = [1.0] * size
    for step in range(steps):
        x = torch.tensor([float(RANK + 1 + i + step) for i in range(size)], device="cuda")
        out = ddp(x)
        out.backward(torch.ones_like(out))
        # The gradient of w is x on each rank; DDP averages it over the ranks.
        grad = [sum(float(r + 1 + i + step) for r in range(WORLD)) / WORLD for i in range(size)]
        check(f"DDP gradient, step {step}", values(model.w.grad), grad)
        with torch.no_grad():
            model.w.add_(model.w.grad, alpha=-lr)
        model.w.grad = None
        w = [wi - lr * gi for wi, gi in zip(w, grad)]
        check(f"parameter after step {step}", values(model.w), w)


def main():
    torch.cuda.set_device(LOCAL_RANK)
    dist.init_process_group("nccl")
    check("world size", dist.get_world_size(), WORLD)
    collectives()
    subgroups()
    streams_and_events()
    data_parallel()
    dist.barrier()
    dist.destroy_process_group()
    say(f"rank {RANK}: {passed} checks passed")


if __name__ == "__main__":
    main()
