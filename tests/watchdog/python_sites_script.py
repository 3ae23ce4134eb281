"""Calls NCCL (the sim's, through ctypes, which releases the GIL as PyTorch does) from known
Python lines, for tests/watchdog/python_sites_test.cc. With --ranks N --rank R --id-file F (or
under `ncclwatch launch`, WORLD_SIZE and RANK) it joins an N-rank communicator; with --skip-on R rank R skips the second collective, so the others
hang in it until the test's collector aborts them."""
import argparse
import ctypes
import os
import time

ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
cudart = ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
nccl = ctypes.CDLL(None)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def unique_id(args):
    uid = UniqueId()
    if args.ranks == 1 or args.rank == 0:
        assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
        if args.ranks > 1:
            with open(args.id_file + ".tmp", "wb") as out:
                out.write(ctypes.string_at(ctypes.addressof(uid), 128))  # all 128 bytes
            os.rename(args.id_file + ".tmp", args.id_file)
        return uid
    while not os.path.exists(args.id_file):
        time.sleep(0.01)
    with open(args.id_file, "rb") as source:
        ctypes.memmove(ctypes.addressof(uid), source.read(), 128)
    return uid


def all_reduce(comm, buffer, count):
    return nccl.ncclAllReduce(buffer, buffer, ctypes.c_size_t(count), 7, 0, comm, None)  # SITE all_reduce


def step(comm, buffer, args):
    all_reduce(comm, buffer, 16)  # SITE step-first
    if args.rank != args.skip_on:
        all_reduce(comm, buffer, 32)  # SITE step-second
    cudart.cudaDeviceSynchronize()  # WAIT


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--id-file", default="")
    parser.add_argument("--skip-on", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    # Under `ncclwatch launch`: the rank and size from its environment.
    args.ranks = int(os.environ.get("WORLD_SIZE", args.ranks))
    args.rank = int(os.environ.get("RANK", args.rank))
    assert cudart.cudaSetDevice(args.rank % 8) == 0
    uid = unique_id(args)
    comm = ctypes.c_void_p()
    assert nccl.ncclCommInitRank(ctypes.byref(comm), args.ranks, uid, args.rank) == 0  # SITE init
    buffer = ctypes.c_void_p()
    assert cudart.cudaMalloc(ctypes.byref(buffer), 4096) == 0
    for _ in range(args.steps):
        step(comm, buffer, args)
    time.sleep(0.3)  # the watchdog's next pass writes the sites


main()
