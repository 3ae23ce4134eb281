"""A one-GPU PyTorch job for scripts/gpu_check.sh: real ProcessGroupNCCL under real torchrun.

    torchrun --nproc_per_node=1 gpu_check_torch.py [--stall-s S]

First 200 all_reduces, each result checked. With --stall-s, one all_reduce then waits behind a
GPU kernel that sleeps about S seconds on the current stream (ProcessGroupNCCL's NCCL stream
waits on it), as a slow forward pass would hold a collective: the call is queued behind other
work, not stuck in NCCL, and the watchdog's texts must not say otherwise. Exits 0 when every
result is right.
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
