"""A one-GPU PyTorch job for scripts/gpu_check.sh: real ProcessGroupNCCL under real torchrun.

    torchrun --nproc_per_node=1 gpu_check_torch.py [--stall-s S]
    torchrun --nproc_per_node=2 gpu_check_torch.py --late-rank-s S

First 200 all_reduces, each result checked. With --stall-s, one all_reduce then waits behind a
GPU kernel that sleeps about S seconds on the current stream (ProcessGroupNCCL's NCCL stream
waits on it), as a slow forward pass would hold a collective: the call is queued behind other
work, not stuck in NCCL, and the watchdog's texts must not say otherwise. Exits 0 when every
result is right.

With --late-rank-s, rank 1 of two never reaches NCCL: it sleeps S seconds before its first
collective (a data loader stuck on a dead file system) and then fails, while rank 0's first
all_reduce waits in NCCL's init of the communicator for it. Rank 1 uses no GPU, so one GPU
serves. ncclwatch must name rank 1 as the one that never joined, while rank 0 waits.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def say(text):
    sys.stdout.write(f"rank {os.environ.get('RANK', '?')}: {text}\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stall-s", type=float, default=0.0)
    parser.add_argument("--late-rank-s", type=float, default=0.0)
    args = parser.parse_args()
    if args.late_rank_s > 0:
        return late_rank(args.late_rank_s)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    rank = dist.get_rank()
    for step in range(200):
        value = torch.full((1024,), float(step + rank), device="cuda")
        dist.all_reduce(value)
        expected = sum(float(step + r) for r in range(world))
        if step % 50 == 0 and value[0].item() != expected:
            say(f"FAILED all_reduce at step {step}: {value[0].item()} != {expected}")
            return 1
    torch.cuda.synchronize()
    say("200 all_reduces ok")
    if args.stall_s > 0:
        # Calibrate the sleep kernel: cycles per second on this GPU.
        start = time.monotonic()
        torch.cuda._sleep(100_000_000)
        torch.cuda.synchronize()
        per_second = 100_000_000 / max(1e-6, time.monotonic() - start)
        value = torch.ones(1024, device="cuda")
        torch.cuda._sleep(int(per_second * args.stall_s))
        issued = time.monotonic()
        dist.all_reduce(value)  # STALLED behind the sleep kernel
        got = value[0].item()
        say(f"stalled all_reduce done after {time.monotonic() - issued:.1f} s: {got}")
        if got != float(world):
            return 1
    dist.destroy_process_group()
    say("done")
    return 0


def late_rank(seconds):
    if os.environ.get("RANK") == "1":
        time.sleep(seconds)  # LATE: never reaches init_process_group, so never NCCL
        say(f"gave up after {seconds:.0f} s without reaching NCCL")
        return 1
    torch.cuda.set_device(0)
    # PyTorch may create the communicator here (eager init) or at the first collective.
    dist.init_process_group("nccl")
    value = torch.ones(1024, device="cuda")
    dist.all_reduce(value)  # WAITS in NCCL's init for rank 1
    say(f"all_reduce done: {value[0].item()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
