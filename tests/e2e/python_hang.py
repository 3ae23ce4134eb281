"""A Python program that drives NCCL through ctypes into a hang, for ncclwatch's dump test.

One rank, one communicator; the sim's stall fault (NCCLSIM_FAULT=stall:rank=0,seq=3) makes the
third allreduce never finish, so train_step waits forever in cudaStreamSynchronize (ctypes
releases the GIL during the call, as PyTorch does around its CUDA waits). A second thread waits
in data_loader, so the dump must show two Python threads.
"""
import ctypes
import threading
import time

# Loaded into the global scope and called through it, as a program linked against NCCL calls it
# (a ctypes handle of libnccl itself would look its functions up inside libnccl alone, past any
# LD_PRELOAD library).
ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
cudart = ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
nccl = ctypes.CDLL(None)

NCCL_FLOAT = 7
NCCL_SUM = 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def init():
    assert cudart.cudaSetDevice(0) == 0
    uid = UniqueId()
    assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    buffer = ctypes.c_void_p()
    assert cudart.cudaMalloc(ctypes.byref(buffer), 4096) == 0
    stream = ctypes.c_void_p()
    assert cudart.cudaStreamCreate(ctypes.byref(stream)) == 0
    return comm, buffer, stream


def data_loader(stop):
    while not stop.is_set():
        time.sleep(0.05)  # the loader thread's line


def train_step(comm, buffer, stream):
    assert nccl.ncclAllReduce(buffer, buffer, ctypes.c_size_t(1024), NCCL_FLOAT, NCCL_SUM, comm,
                              stream) == 0
    cudart.cudaStreamSynchronize(stream)  # HANG LINE: the stalled allreduce never finishes


def main():
    comm, buffer, stream = init()
    stop = threading.Event()
    loader = threading.Thread(target=data_loader, args=(stop,), daemon=True)
    loader.start()
    for step in range(10):
        print(f"step {step}", flush=True)
        train_step(comm, buffer, stream)
    stop.set()


main()
