// The ncclwatch command line. Each subcommand lives in its own file; this file only wires
// them to CLI11 and turns parse errors into one line and exit code 2.
#include <CLI/CLI.hpp>

#include <cstdio>

#include <iostream>

#include "inspect.h"
#include "launch.h"
#include "show.h"

namespace {

constexpr const char* kExamples = R"(Examples:
  ncclwatch launch -n 8 -- build/examples/train_loop --steps 10
  LD_LIBRARY_PATH=build/sim/lib ncclwatch launch -n 4 -- build/examples/train_loop --bug skip:rank=1,step=3
  ncclwatch inspect ./ncclwatch-logs/my-job
)";

void addLaunch(CLI::App& app, ncclwatch::launch::Options& options, int& exitCode) {
  CLI::App* launch = app.add_subcommand(
      "launch", "Start N ranks of PROGRAM on this machine with torchrun's variables");
  launch->add_option("-n,--ranks", options.ranks, "number of ranks")
      ->required()
      ->check(CLI::Range(1, 4096));
  double graceSeconds = 5.0;
  launch
      ->add_option("--grace", graceSeconds,
                   "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
      ->check(CLI::Range(0.0, 3600.0));
  bool noPrefix = false;
  launch->add_flag("--no-prefix", noPrefix, "do not prefix output lines with [rank R]");
  launch->add_option("command", options.command, "PROGRAM [ARGS...] (after --)")->required();
  launch->footer("Exit code: the first non-zero exit code of a rank (128+signal for a signal).");
  launch->callback([&options, &exitCode, &graceSeconds, &noPrefix] {
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
  show->footer("Exit code: 0 read cleanly, 1 problems found (still printed), 2 not a trace.");
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
