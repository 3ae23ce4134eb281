# Run by watchdog_python_stacks_test: python3 pystack_script.py <libpystack_probe.so> [gil|blocked]
# Two workers sleep inside worker_alpha and worker_beta; the main thread, inside main_waits_here,
# asks the probe (through ctypes, which releases the GIL) for the Python stacks of all threads.
# With "gil", probe_dump is called through ctypes.PyDLL, which keeps the GIL held during the
# call: the dump must still work (it never takes the GIL). With "blocked" (faulthandler route),
# the main thread blocks the signal for two more dumps, which must give up, then unblocks it.
# The test finds the expected line numbers from the "mark:" comments.
import ctypes
import sys
import threading
import time

probe = ctypes.CDLL(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "gil":
    probe_with_gil = ctypes.PyDLL(sys.argv[1])
    probe.probe_dump = probe_with_gil.probe_dump
probe.probe_prepare.restype = ctypes.c_int
probe.probe_dump.restype = ctypes.c_int
probe.probe_dump.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
started = threading.Barrier(3)


def worker_alpha():
    started.wait()
    time.sleep(3600)  # mark:alpha


def worker_beta():
    started.wait()
    time.sleep(3600)  # mark:beta


def mark_line(name):
    with open(__file__) as script:
        for number, line in enumerate(script, 1):
            if ("# mark:" + name) in line:
                return number
    return -1


ASLEEP = ["line %d in worker_%s" % (mark_line(name), name) for name in ("alpha", "beta")]


def main_waits_here():
    buf = ctypes.create_string_buffer(1 << 20)
    route, text = -1, ""
    for _ in range(300):  # until faulthandler is armed and both workers are asleep
        route = probe.probe_dump(buf, len(buf))  # mark:main
        text = buf.value.decode("ascii", "replace")
        if all(asleep in text for asleep in ASLEEP):
            break
        if "not available" in text and "not armed yet" not in text:
            break
        time.sleep(0.01)
    return route, text


print("PREPARED", probe.probe_prepare())
print("EXPORTED", int(hasattr(ctypes.pythonapi, "_Py_DumpTracebackThreads")))
for target in (worker_alpha, worker_beta):
    threading.Thread(target=target, daemon=True).start()
started.wait()
route, text = main_waits_here()
if len(sys.argv) > 2 and sys.argv[2] == "blocked":
    import signal

    blocked = {signal.SIGRTMIN + 4}
    buf = ctypes.create_string_buffer(4096)
    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    for _ in range(2):
        blocked_route = probe.probe_dump(buf, len(buf))
        print("BLOCKED", blocked_route, buf.value.decode("ascii", "replace").strip())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    route, text = main_waits_here()
print("ROUTE", route)
print("BEGIN-DUMP")
print(text, end="")
print("END-DUMP")
sys.stdout.flush()
