// The ncclwatch command line. Each subcommand lives in its own file; this file only wires
// them to CLI11 and turns parse errors into one line and exit code 2.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>

#include <fstream>
#include <iostream>

#include "collect.h"
#include "demo.h"
#include "inspect.h"
#include "launch.h"
#include "relay.h"
#include "remote_stacks.h"
#include "report.h"
#include "show.h"
#include "stacks.h"
#include "stragglers.h"
#include "timeline.h"

namespace {

constexpr const char* kExamples = R"(Examples:
  ncclwatch demo                      # 8 simulated ranks, an injected bug, the whole diagnosis
  ncclwatch launch -n 8 -- build/examples/train_loop --steps 10
  LD_LIBRARY_PATH=build/sim/lib ncclwatch launch -n 4 -- build/examples/train_loop --bug skip:rank=1,step=3
  ncclwatch inspect ./ncclwatch-logs/my-job
  ncclwatch timeline ./ncclwatch-logs/my-job -o my-job.json
  ncclwatch stragglers ./ncclwatch-logs/my-job
Run `ncclwatch SUBCOMMAND --help` for each subcommand's options, examples and exit codes.
)";

void addLaunch(CLI::App& app, ncclwatch::launch::Options& options, int& exitCode) {
  CLI::App* launch = app.add_subcommand(
      "launch", "Start N ranks of PROGRAM on this machine with torchrun's variables");
  launch->add_option("-n,--ranks", options.ranks, "number of ranks")
      ->required()
      ->check(CLI::Range(1, 4096));
  // Static: CLI11 writes the parsed values through these addresses after this function returns.
  static double graceSeconds = 5.0;
  launch
      ->add_option("--grace", graceSeconds,
                   "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
      ->check(CLI::Range(0.0, 3600.0));
  static bool noPrefix = false;
  launch->add_flag("--no-prefix", noPrefix, "do not prefix output lines with [rank R]");
  launch->add_flag("--keep-going", options.keepGoing,
                   "leave the other ranks running when one fails (watch what its failure does)");
  launch->add_option("command", options.command, "PROGRAM [ARGS...] (after --)")->required();
  launch->footer(R"(Examples:
  ncclwatch launch -n 4 -- build/examples/train_loop --steps 5
  LD_PRELOAD=$PWD/build/lib/libncclwatch.so ncclwatch launch -n 8 -- python train.py
Exit code: the first non-zero exit code of a rank (128+signal for a signal).)");
  launch->callback([&options, &exitCode] {
    options.grace = std::chrono::milliseconds(static_cast<long>(graceSeconds * 1000));
    options.prefix = !noPrefix;
    exitCode = ncclwatch::launch::run(options);
  });
}

void addShow(CLI::App& app, int& exitCode) {
  CLI::App* show =
      app.add_subcommand("show", "Print one ring file: header, communicators, records");
  static std::string path;
  static bool json = false;
  show->add_option("file", path, "a .ncclwatch ring file")->required();
  show->add_flag("--json", json, "print JSON instead of a table");
  show->footer(R"(Examples:
  ncclwatch show ./ncclwatch-logs/job-1234/node7-4242.ncclwatch
  ncclwatch show node7-4242.ncclwatch --json
Exit code: 0 read cleanly, 1 problems found (still printed), 2 not a trace.)");
  show->callback(
      [&exitCode] { exitCode = ncclwatch::show::run(path, json, std::cout, std::cerr); });
}

void addInspect(CLI::App& app, int& exitCode) {
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Cross-rank diagnosis of a job's ring files: why it hangs, who to blame");
  static ncclwatch::inspect::Options options;
  static bool colour = false, noColour = false;
  inspect
      ->add_option("dir", options.directory,
                   "folder of a job's .ncclwatch files (searched recursively)")
      ->required();
  inspect->add_flag("--json", options.json, "print the verdicts as JSON lines (docs/verdicts.md)");
  inspect->add_flag(
      "--report-json", options.reportJson,
      "print the whole report (summary, verdicts, communicators) as one JSON document");
  inspect
      ->add_option(
          "--quiet", options.quietSeconds,
          "seconds without NCCL activity after which a running job counts as hung (default 10)")
      ->check(CLI::Range(0.0, 86400.0));
  inspect->add_flag("--color", colour, "colour the output even when it is not a terminal");
  inspect->add_flag("--no-color", noColour, "never colour the output");
  inspect->footer(R"(Examples:
  ncclwatch inspect ./ncclwatch-logs/job-1234
  ncclwatch inspect /shared/logs/run7 --json > verdicts.jsonl

Prints what happened, then each verdict (mismatch, missing, unmatched_p2p, stuck, deadlock,
dead_rank, init_hang, straggler) with the ranks grouped by what they did, then a summary per
communicator. Unreadable or corrupt files are named on stderr; the rest is still analysed.
Exit code: 0 no finding (stragglers are information), 1 findings, 2 usage or I/O error.)");
  inspect->callback([&exitCode] {
    options.colour = noColour ? 0 : colour ? 1 : -1;
    exitCode = ncclwatch::inspect::run(options, std::cout, std::cerr);
  });
}

void addStacks(CLI::App& app, int& exitCode) {
  CLI::App* stacks = app.add_subcommand(
      "stacks", "STAT-style merged stack tree of every rank's dump of the hang, classes first");
  static ncclwatch::stacks::Options options;
  stacks
      ->add_option("dir", options.directory,
                   "folder of a job's .ncclwatch files (searched recursively)")
      ->required();
  stacks
      ->add_option("--by", options.by,
                   "merge native frames by function (default) or by module+offset")
      ->check(CLI::IsMember({"function", "module"}));
  stacks->add_flag("--json", options.json, "print one JSON document");
  stacks->add_flag("--all-threads", options.allThreads,
                   "merge every thread, not only the one that issued the hung call");
  stacks->add_flag("--no-mixed", options.noMixed,
                   "keep native and Python stacks in two trees, native frames unfolded");
  stacks->footer(R"(Prints the equivalence classes (ranks whose thread that matters has the same
stack) with a representative rank each, the suspects ordered by how far behind their last call
is, then the native and the Python trees (outermost frame first, rank sets like [0-4,6-7]). A
thread that runs Python code gets a mixed stack: its Python frames where the interpreter runs
them, runtime and PyTorch frames folded (--no-mixed: native frames only).
Exit code: 0 printed, 1 no rank has a dump, 2 usage or I/O error.)");
  stacks->callback(
      [&exitCode] { exitCode = ncclwatch::stacks::run(options, std::cout, std::cerr); });
}

void addStacksOf(CLI::App& app, int& exitCode) {
  CLI::App* stacksOf = app.add_subcommand(
      "stacks-of", "Native stacks of every thread of a running process, through ptrace");
  static ncclwatch::stacks_of::Options options;
  static int perThreadMs = 200;
  stacksOf->add_option("pid", options.pid, "the process")->required();
  stacksOf->add_option("--per-thread-ms", perThreadMs, "how long one thread may take to stop")
      ->check(CLI::Range(1, 60000));
  stacksOf->add_flag("--wait-go", options.waitForGo,
                     "attach only after one byte (or end of input) on stdin");
  stacksOf->footer(R"(Stops one thread at a time without a signal (PTRACE_SEIZE + PTRACE_INTERRUPT:
interrupted sleeps continue, nanosleep keeps its length), unwinds it with libdwfl and detaches it at
once. Prints an `ncclwatch-dump 1` block (docs/format.md). The watchdog runs this for its dumps.
Exit code: 0 printed, 2 usage error, 3 ptrace not possible (the reason on stderr).)");
  stacksOf->callback([&exitCode] {
    options.perThread = std::chrono::milliseconds(perThreadMs);
    exitCode = ncclwatch::stacks_of::run(options, std::cout, std::cerr);
  });
}

void addReport(CLI::App& app, int& exitCode) {
  CLI::App* report = app.add_subcommand(
      "report", "Write one self-contained HTML page: verdicts, timeline, merged stacks, ranks");
  static ncclwatch::report::Options options;
  report
      ->add_option("dir", options.directory,
                   "folder of a job's .ncclwatch files (searched recursively)")
      ->required();
  report->add_option("-o,--output", options.output, "the .html file to write")->required();
  report->footer("Exit code: 0 written, 2 usage or I/O error.");
  report->callback([&exitCode] { exitCode = ncclwatch::report::run(options, std::cerr); });
}

void addTimeline(CLI::App& app, int& exitCode) {
  CLI::App* timeline = app.add_subcommand(
      "timeline", "Write a Perfetto/Chrome trace-event JSON timeline of every rank's calls");
  static ncclwatch::timeline::Options options;
  timeline
      ->add_option("dir", options.directory,
                   "folder of a job's .ncclwatch files (searched recursively)")
      ->required();
  timeline->add_option("-o,--output", options.output, "the .json file to write ('-': stdout)")
      ->required();
  timeline->footer(R"TXT(Examples:
  ncclwatch timeline ./ncclwatch-logs/job-1234 -o job.json    # then open ui.perfetto.dev
  ncclwatch timeline /shared/logs/run7 -o - | gzip > run7.json.gz

One process per rank ("rank 3 (host:pid)"), per communicator and stream a track of the calls as
they ran (start to completion) and tracks of the calls queued on the stream (issue to start),
instants for dumps and for the verdicts on the ranks they concern. Hosts' clocks are aligned on
collective completion, not on wall clocks.
Exit code: 0 written, 2 usage or I/O error. Unreadable or corrupt files are named on stderr.)TXT");
  timeline->callback(
      [&exitCode] { exitCode = ncclwatch::timeline::run(options, std::cout, std::cerr); });
}

void addStragglers(CLI::App& app, int& exitCode) {
  CLI::App* stragglers = app.add_subcommand(
      "stragglers", "How late each rank arrives at collectives; who the others wait for");
  static ncclwatch::stragglers::Options options;
  static bool colour = false, noColour = false;
  stragglers
      ->add_option("dir", options.directory,
                   "folder of a job's .ncclwatch files (searched recursively)")
      ->required();
  stragglers->add_option("--top", options.top, "ranks shown per communicator, 0: all (default 5)")
      ->check(CLI::Range(0, 1 << 24));
  stragglers->add_flag("--color", colour, "colour the output even when it is not a terminal");
  stragglers->add_flag("--no-color", noColour, "never colour the output");
  stragglers->footer(R"TXT(Examples:
  ncclwatch stragglers ./ncclwatch-logs/job-1234
  ncclwatch stragglers /shared/logs/run7 --top 0

For each collective every member issued, a rank's lateness is its issue time minus the earliest
member's (hosts' clocks aligned on collective completion). Per communicator: median, p95 and
max lateness and how often each rank was the last to arrive; then the ranks the others wait for.
Exit code: 0 no straggler, 1 stragglers found, 2 usage or I/O error.)TXT");
  stragglers->callback([&exitCode] {
    options.colour = noColour ? 0 : colour ? 1 : -1;
    exitCode = ncclwatch::stragglers::run(options, std::cout, std::cerr);
  });
}

void addDemo(CLI::App& app, int& exitCode) {
  CLI::App* demo = app.add_subcommand(
      "demo", "Run 8 simulated ranks with an injected bug under ncclwatch (no GPU needed)");
  static ncclwatch::demo::Options options;
  static bool colour = false, noColour = false;
  demo->add_option("--bug", options.bug,
                   "train_loop bug: KIND or KIND:rank=R,step=S[,ms=N]; kinds: skip, op, count, "
                   "dtype, root, extra, peer, color, order, exit, crash, slow (default "
                   "skip:rank=3,step=5)");
  demo->add_option("--ranks", options.ranks, "number of ranks (default 8)")
      ->check(CLI::Range(2, 64));
  demo->add_option("--steps", options.steps, "training steps (default 10)")
      ->check(CLI::Range(1, 1000));
  demo->add_option("--dir", options.directory,
                   "folder for the traces, timeline and report (default: a new folder under "
                   "./ncclwatch-demo)");
  demo->add_option("--timeout", options.timeoutSeconds,
                   "seconds after which a job still running is stopped (default 45)")
      ->check(CLI::Range(1.0, 3600.0));
  demo->add_flag("--color", colour, "colour the output even when it is not a terminal");
  demo->add_flag("--no-color", noColour, "never colour the output");
  demo->footer(R"TXT(Examples:
  ncclwatch demo                      # rank 3 skips an allreduce at step 5: a mismatch
  ncclwatch demo --bug order --ranks 4
  ncclwatch demo --bug slow:rank=2,step=0,ms=30

Runs build/examples/train_loop with the sim libraries and libncclwatch.so found next to this
binary, shows the watchdogs' live blocks, stops the job once every rank has dumped, then prints
the diagnosis and writes timeline.json and report.html next to the traces.
Exit code: 0 nothing found, 1 findings (the injected bug), 2 usage or set-up error.)TXT");
  demo->callback([&exitCode] {
    options.colour = noColour ? 0 : colour ? 1 : -1;
    exitCode = ncclwatch::demo::run(options, std::cout, std::cerr);
  });
}

constexpr const char* kSilentRankAbortHelp =
    "with --abort: how much longer a rank alive but silent while the others wait must stay silent "
    "before the job is aborted for it, as a checkpoint or data loading on one rank looks the same "
    "for a while (default 300000: a large checkpoint takes minutes)";

void addRun(CLI::App& app, int& exitCode) {
  CLI::App* run = app.add_subcommand(
      "run", "Run a job under ncclwatch: preloaded recorder, live cross-rank verdicts");
  static ncclwatch::collect::RunOptions options;
  run->add_option("--dir", options.directory, "folder for the traces and verdicts.jsonl");
  run->add_flag("--abort", options.abortOnVerdict,
                "abort the communicator of every verdict so that the job fails now");
  run->add_option("--quiet-ms", options.quietMs,
                  "a job whose ranks wait this long without progress is hung (default 3000)")
      ->check(CLI::Range(int64_t{100}, int64_t{86'400'000}));
  run->add_option("--silent-rank-abort-ms", options.silentRankAbortMs, kSilentRankAbortHelp)
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  run->add_option("--preload", options.preload,
                  "libncclwatch.so to preload (default: beside "
                  "the CLI, ../lib/libncclwatch.so)");
  run->add_flag("--plugin-only", options.pluginOnly,
                "load libncclwatch.so as NCCL's profiler plugin (NCCL_PROFILER_PLUGIN) instead "
                "of LD_PRELOAD: for programs with NCCL linked statically");
  run->add_option("command", options.command, "the program and its arguments (after --)")
      ->required();
  run->footer(R"(Examples:
  ncclwatch run -- torchrun --nproc_per_node=8 train.py
  ncclwatch run --plugin-only -- ./app_with_static_nccl
  ncclwatch run --dir /tmp/logs -- ncclwatch launch -n 8 -- build/examples/train_loop --bug skip:rank=3,step=5

Hosts the collector on 127.0.0.1, runs the program with NCCLWATCH_COLLECTOR, NCCLWATCH_SECRET,
NCCLWATCH_DIR and LD_PRELOAD (or, with --plugin-only, NCCL_PROFILER_PLUGIN) set, prints each verdict as soon as the ranks' calls show it, and
exits with the program's exit code.)");
  run->callback(
      [&exitCode] { exitCode = ncclwatch::collect::runJob(options, std::cout, std::cerr); });
}

void addCollect(CLI::App& app, int& exitCode) {
  CLI::App* collect =
      app.add_subcommand("collect", "The collector alone, for jobs started without `run`");
  static ncclwatch::collect::Options options;
  static std::string secretFile, secretVariable;
  collect->add_option("--listen", options.listen, "host:port to listen on")->required();
  auto* fromFile =
      collect->add_option("--secret-file", secretFile, "file holding the job's secret");
  auto* fromEnvironment = collect->add_option("--secret-env", secretVariable,
                                              "environment variable holding the job's secret");
  fromFile->excludes(fromEnvironment);
  collect->add_option("--dir", options.directory, "folder for verdicts.jsonl");
  collect->add_flag("--abort", options.abortOnVerdict, "abort communicators with verdicts");
  collect
      ->add_option("--quiet-ms", options.quietMs,
                   "a job whose ranks wait this long without progress is hung (default 3000)")
      ->check(CLI::Range(int64_t{100}, int64_t{86'400'000}));
  collect->add_option("--silent-rank-abort-ms", options.silentRankAbortMs, kSilentRankAbortHelp)
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  collect
      ->add_option("--max-records", options.maxRecords,
                   "call records kept for analysis, shared by the ranks (128 bytes each)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 28));
  collect
      ->add_option("--analysis-threads", options.analysisThreads,
                   "threads an analysis pass may use for jobs of 512 ranks or more (default: half "
                   "the cores, 8 at most)")
      ->check(CLI::Range(1, 64));
  collect
      ->add_option("--reader-threads", options.readerThreads,
                   "threads that read and decode the agents' frames beside the one that stores and "
                   "analyses them (default 1)")
      ->check(CLI::Range(1, 64));
  collect->add_flag("--until-idle", options.untilIdle,
                    "exit once every agent has gone for 1 s (or none came within 60 s, or a newer "
                    "job's agents knock while none of its own is connected)");
  collect
      ->add_option("--listen-wait-ms", options.listenWaitMs,
                   "keep trying a port in use this long (a previous collector ending)")
      ->check(CLI::Range(0, 600'000));
  collect->footer(R"(Example:
  ncclwatch collect --listen 0.0.0.0:29555 --secret-file ~/.ncclwatch-secret --dir /shared/logs
  (each rank: NCCLWATCH_COLLECTOR=<host>:29555 NCCLWATCH_SECRET=<the secret>))");
  collect->callback([&exitCode] {
    if (!secretVariable.empty()) {
      const char* value = std::getenv(secretVariable.c_str());
      if (value == nullptr || *value == '\0') {
        std::cerr << "ncclwatch collect: " << secretVariable << " holds no secret\n";
        exitCode = 2;
        return;
      }
      options.secret = value;
    } else if (secretFile.empty()) {
      std::cerr << "ncclwatch collect: give the job's secret with --secret-file or --secret-env\n";
      exitCode = 2;
      return;
    } else {
      std::ifstream file(secretFile);
      std::getline(file, options.secret);
      if (!file && options.secret.empty()) {
        std::cerr << "ncclwatch collect: cannot read the secret from " << secretFile << "\n";
        exitCode = 2;
        return;
      }
    }
    exitCode = ncclwatch::collect::runCollect(options, std::cout, std::cerr);
  });
}

void addRelay(CLI::App& app, int& exitCode) {
  CLI::App* relay = app.add_subcommand(
      "relay", "One host's relay to the collector (started by the host's relay rank)");
  static ncclwatch::relay::Options options;
  static std::string collector;
  relay->add_option("--collector", collector, "the collector's host:port")->required();
  auto* fromFd = relay->add_option("--listen-fd", options.listenFd,
                                   "a listening socket inherited from the relay rank");
  auto* byName = relay->add_option("--listen-name", options.listenName,
                                   "an abstract unix socket name to listen on");
  fromFd->excludes(byName);
  relay->add_option("--idle-ms", options.idleMs, "end once no agent was connected this long")
      ->check(CLI::Range(1, 3'600'000));
  static bool noFold = false;
  relay->add_flag("--no-fold", noFold,
                  "pass every frame on as it came (no folding of host-local calls)");
  relay->callback([&exitCode] {
    size_t colon = collector.rfind(':');
    if (colon == std::string::npos || colon + 1 == collector.size()) {
      std::cerr << "ncclwatch relay: --collector " << collector << " is not host:port\n";
      exitCode = 2;
      return;
    }
    std::string host = collector.substr(0, colon);
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    options.collectorHost = host;
    options.collectorPort = std::atoi(collector.c_str() + colon + 1);
    // The relay runs with its rank's environment: NCCLWATCH_RELAY_FOLD=off passes every frame
    // on as it came (docs/configuration.md).
    if (const char* fold = std::getenv("NCCLWATCH_RELAY_FOLD"); fold != nullptr && *fold) {
      std::string value = fold;
      if (value == "off" || value == "0" || value == "no" || value == "false") {
        options.fold = false;
      } else if (value != "on" && value != "1" && value != "yes" && value != "true") {
        std::cerr << "[ncclwatch] relay: NCCLWATCH_RELAY_FOLD=" << value
                  << " is not on or off; folding\n";
      }
    }
    if (noFold) options.fold = false;
    exitCode = ncclwatch::relay::runRelay(options, std::cerr);
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ncclwatch: finds out why a multi-GPU NCCL job hangs"};
  app.footer(kExamples);
  app.require_subcommand(1);
  int exitCode = 0;
  ncclwatch::launch::Options launchOptions;
  addLaunch(app, launchOptions, exitCode);
  addShow(app, exitCode);
  addInspect(app, exitCode);
  addStacks(app, exitCode);
  addStacksOf(app, exitCode);
  addReport(app, exitCode);
  addTimeline(app, exitCode);
  addStragglers(app, exitCode);
  addDemo(app, exitCode);
  addRun(app, exitCode);
  addCollect(app, exitCode);
  addRelay(app, exitCode);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "ncclwatch: %s (see ncclwatch --help)\n", error.what());
    return 2;
  }
  return exitCode;
}
