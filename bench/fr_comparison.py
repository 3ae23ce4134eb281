#!/usr/bin/env python3
"""ncclwatch beside PyTorch's Flight Recorder on the same PyTorch hangs (tests/pytorch_hangs).

Usage: bench/fr_comparison.py [--build build] [--fr-timeout 20] [--bugs skip,shape,raise,subgroup]

Runs each hang of tests/pytorch_hangs/hangs.py twice under the real torchrun on the sim:
  1. `ncclwatch run --abort` with nothing configured: its first live verdict;
  2. without ncclwatch, Flight Recorder on (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_ON_TIMEOUT and
     the process group's timeout set to --fr-timeout s; PyTorch's default timeout is 600 s),
     then `torchfrtrace` on its dumps.
Prints one row per hang and tool: seconds from hang onset to the first answer, whether the
culprit rank and the Python line are right, and what the user had to set. Onset is the issue
time of the first call that never completed (ncclwatch: the verdict's divergence time; Flight
Recorder: the earliest entry not completed in its dumps). Not in CI: about a minute per hang.
"""
import argparse
import glob
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "pytorch_hangs", "hangs.py")
# Per hang: the culprit rank and the marker of the line that issued the hung call.
EXPECTED = {
    "skip": (1, "# HUNG skip"),
    "shape": (1, "# HUNG shape"),
    "raise": (2, "dist.all_reduce(grad)  # the step"),
    "subgroup": (1, "# HUNG subgroup"),
}


def line_of(marker):
    with open(SCRIPT) as script:
        for number, text in enumerate(script, 1):
            if marker in text:
                return number
    raise SystemExit(f"fr_comparison: no line with {marker!r} in {SCRIPT}")


def sim_env(build):
    sim = os.path.join(build, "sim", "lib")
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(
        os.path.join(sim, name) for name in ("libcuda.so.1", "libcudart.so.13", "libnccl.so.2"))
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun(build, bug, extra):
    return [os.path.join(build, "torch-venv", "bin", "torchrun"), "--standalone",
            "--nproc_per_node=4", SCRIPT, "--bug", bug] + extra


def run_ncclwatch(build, bug):
    folder = tempfile.mkdtemp(prefix=f"frcmp-nw-{bug}-")
    cli = os.path.join(build, "bin", "ncclwatch")
    started = time.time()
    subprocess.run(["timeout", "180", cli, "run", "--abort", "--dir", folder, "--"] +
                   torchrun(build, bug, []), env=sim_env(build), stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.time() - started
    try:
        with open(os.path.join(folder, "verdicts.jsonl")) as verdicts:
            first = json.loads(verdicts.readline())
    except (OSError, ValueError):
        return {"answer_s": None, "culprits": [], "lines": [], "said": "no verdict", "wall": wall}
    lines = re.findall(r"hangs\.py:(\d+)", " ".join(
        c["call"].get("issued_at", "") for c in first.get("classes", [])))
    return {
        "answer_s": (first["detection_ns"] - first["divergence_ns"]) / 1e9,
        "culprits": first.get("culprits", []),
        "lines": sorted({int(n) for n in lines}),
        "said": f"{first['kind']} culprits {first.get('culprits')}",
        "wall": wall,
    }


def read_dumps(folder):
    dumps = {}
    for path in glob.glob(os.path.join(folder, "nccl_trace_rank_*")):
        try:
            with open(path, "rb") as dump:
                dumps[int(path.rsplit("_", 1)[1])] = (pickle.load(dump), os.path.getmtime(path))
        except (OSError, ValueError, pickle.UnpicklingError, EOFError):
            pass
    return dumps


def run_flight_recorder(build, bug, timeout_s):
    folder = tempfile.mkdtemp(prefix=f"frcmp-fr-{bug}-")
    env = sim_env(build)
    env["TORCH_FR_BUFFER_SIZE"] = "2000"
    env["TORCH_FR_DUMP_ON_TIMEOUT"] = "1"
    env["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(folder, "nccl_trace_rank_")
    started = time.time()
    subprocess.run(["timeout", str(timeout_s + 120)] +
                   torchrun(build, bug, ["--timeout", str(timeout_s)]), env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - started
    dumps = read_dumps(folder)
    if not dumps:
        return {"answer_s": None, "culprits": [], "lines": [], "said": "no dump", "wall": wall}
    hung = [e for d, _ in dumps.values() for e in d.get("entries", [])
            if e.get("state") != "completed"]
    onset = min((e["time_created_ns"] for e in hung), default=None)
    lines = sorted({f["line"] for e in hung for f in e.get("frames", [])
                    if f.get("filename", "").endswith("hangs.py") and f.get("name") == "train"})
    frtrace = os.path.join(build, "torch-venv", "bin", "torchfrtrace")
    analysis_started = time.time()
    command = [frtrace, folder, "-p", "nccl_trace_rank_"]
    if len(dumps) < 4:
        command.append("--allow-incomplete-ranks")  # without it, torchfrtrace refuses
    result = subprocess.run(command, capture_output=True, text=True)
    analysis_s = time.time() - analysis_started
    text = "\n".join(l for l in (result.stdout + result.stderr).splitlines()
                     if "Warning" not in l and "_conversion_method" not in l and
                     "tabulate" not in l)
    culprits = {int(n) for n in re.findall(r"Culprit rank (\d+)", text)}
    for match in re.finditer(r"(?:missing|culprit)[^\n]*?ranks?\s*[\[{(]?([0-9][0-9, ]*)", text,
                             re.IGNORECASE):
        culprits.update(int(n) for n in re.findall(r"\d+", match.group(1)))
    first_dump = min(mtime for _, mtime in dumps.values())
    said = next((l.strip() for l in text.splitlines() if l.strip()), "(no output)")
    return {
        "answer_s": None if onset is None else first_dump - onset / 1e9 + analysis_s,
        "culprits": sorted(culprits),
        "lines": lines,
        "said": f"dumps from ranks {sorted(dumps)}; torchfrtrace: {said[:160]}",
        "wall": wall,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--fr-timeout", type=int, default=20)
    parser.add_argument("--bugs", default="skip,shape,raise,subgroup")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    python = os.path.join(build, "torch-venv", "bin", "python")
    if not os.path.exists(python):
        print(f"fr_comparison: no torch venv in {build} (scripts/torch_venv.sh)")
        return 2
    # torchfrtrace prints its tables with tabulate, which torch does not install.
    subprocess.run([python, "-m", "pip", "install", "--quiet", "tabulate"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bugs = [b for b in args.bugs.split(",") if b]
    for bug in bugs:
        if bug not in EXPECTED:
            print(f"fr_comparison: unknown hang {bug!r} (one of {', '.join(EXPECTED)})")
            return 2
    print("hang      tool       answer_s  culprit  line   set by the user / what it said")
    for bug in bugs:
        culprit, marker = EXPECTED[bug]
        line = line_of(marker)
        rows = [("ncclwatch", run_ncclwatch(build, bug), "nothing (ncclwatch run)"),
                ("flightrec", run_flight_recorder(build, bug, args.fr_timeout),
                 f"TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_ON_TIMEOUT, timeout={args.fr_timeout}s")]
        for tool, row, setting in rows:
            answer = "-" if row["answer_s"] is None else f"{row['answer_s']:.1f}"
            right_culprit = "yes" if row["culprits"] == [culprit] else (
                "part" if culprit in row["culprits"] else "no")
            right_line = "yes" if line in row["lines"] else "no"
            print(f"{bug:9} {tool:10} {answer:>8}  {right_culprit:7}  {right_line:5}  "
                  f"{setting}; {row['said']} (lines {row['lines']}, job {row['wall']:.0f} s)")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
