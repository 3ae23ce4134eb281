"""PyTorch hangs, each with its own bug, for tests/pytorch_hangs and bench/fr_comparison.sh.

    torchrun --nproc_per_node=4 hangs.py
        --bug skip|shape|raise|subgroup|root|redop|extra|recvfirst|tags [--timeout S]

skip      rank 1 skips one gradient all_reduce at step 2 (a data-dependent `if`);
shape     rank 1 all-reduces a tensor of another shape at step 2;
raise     rank 2 raises at step 2 and exits while the others wait in the next all_reduce;
subgroup  rank 1 skips a barrier of the subgroup {0, 1} at step 2;
root      rank 2 broadcasts the step-2 bucket from rank 1 where the others broadcast from 0;
redop     rank 1 reduces the step-2 bucket with MAX where the others SUM: NCCL completes it,
          the result is wrong on every rank (silent data corruption, no hang);
extra     rank 2 calls an extra barrier before its step-2 bucket;
recvfirst ranks 1 and 2 each receive from the other before they send to it at step 2 (a
          pipeline's exchange without batch_isend_irecv): a deadlock on the GPU streams.
tags      rank 1 sends rank 2 a gradient (8) and a mask (2) with tags, in one batch_isend_irecv;
          rank 2 posts its receives in the other order, trusting the tags, which NCCL ignores:
          each pair disagrees on its size (written in session 18, before the verdict's hint).
Each hung (or wrong) call's line carries "# HUNG <bug>"; tests find it there. --timeout sets PyTorch's own
collective timeout (its watchdog and Flight Recorder dump on it).
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def say(text):
    sys.stdout.write(f"rank {RANK}: {text}\n")
    sys.stdout.flush()


def train(bug):
    grad = torch.tensor([float(RANK + 1)] * 8, device="cuda")
    pair = dist.new_group([0, 1])
    for step in range(4):
        dist.all_reduce(grad)  # the step's first gradient bucket
        data_says_skip = RANK == 1 and step == 2  # e.g. a loss that came out NaN on one rank
        if bug == "root" and step == 2:
            dist.broadcast(grad, src=1 if RANK == 2 else 0)  # HUNG root
        elif bug == "redop" and step == 2:
            op = dist.ReduceOp.MAX if RANK == 1 else dist.ReduceOp.SUM
            dist.all_reduce(grad, op=op)  # HUNG redop
        elif bug == "recvfirst" and step == 2 and RANK in (1, 2):
            # dist.recv only makes the stream wait: the send queues behind the receive
            dist.recv(grad, src=3 - RANK)  # HUNG recvfirst
            dist.send(grad, dst=3 - RANK)
            dist.all_reduce(grad)
        elif bug == "tags" and step == 2 and RANK in (1, 2):
            mask = torch.zeros(2, device="cuda")
            if RANK == 1:
                ops = [dist.P2POp(dist.isend, grad, 2, tag=1), dist.P2POp(dist.isend, mask, 2, tag=2)]
            else:
                ops = [dist.P2POp(dist.irecv, mask, 1, tag=2), dist.P2POp(dist.irecv, grad, 1, tag=1)]
            for work in dist.batch_isend_irecv(ops):  # HUNG tags
                work.wait()
            dist.all_reduce(grad)
        elif bug == "extra" and step == 2 and RANK == 2:
            dist.barrier()  # HUNG extra
            dist.all_reduce(grad)
        elif bug == "skip" and data_says_skip:
            say("skips the second bucket")
        else:
            if bug == "shape" and data_says_skip:
                wrong = torch.ones(4, device="cuda")
                dist.all_reduce(wrong)  # HUNG shape
            else:
                dist.all_reduce(grad)  # HUNG skip
        if bug == "raise" and RANK == 2 and step == 2:
            raise ValueError("rank 2 cannot load its next batch")
        if bug == "subgroup" and RANK in (0, 1) and not (RANK == 1 and step == 2):
            dist.barrier(group=pair)  # HUNG subgroup
        value = grad.sum().item()  # WAIT: where a rank blocks on the result
        say(f"step {step} done ({value:.0f})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", required=True,
                        choices=["skip", "shape", "raise", "subgroup", "root", "redop", "extra",
                                 "recvfirst", "tags"])
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.timeout),
                            device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
    train(args.bug)
    dist.destroy_process_group()


main()
