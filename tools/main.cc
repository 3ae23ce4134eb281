// The ncclwatch command line. Each subcommand lives in its own file; this file only wires
// them to CLI11 and turns parse errors into one line and exit code 2.
#include <CLI/CLI.hpp>

#include <cstdio>

#include <iostream>

#include "launch.h"
#include "show.h"

namespace {

constexpr const char* kExamples = R"(Examples:
  ncclwatch launch -n 8 -- build/examples/train_loop --steps 10
  LD_LIBRARY_PATH=build/sim/lib ncclwatch launch -n 4 -- build/examples/train_loop --bug skip:rank=1,step=3
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ncclwatch: finds out why a multi-GPU NCCL job hangs"};
  app.footer(kExamples);
  app.require_subcommand(1);
  int exitCode = 0;
  ncclwatch::launch::Options launchOptions;
  addLaunch(app, launchOptions, exitCode);
  addShow(app, exitCode);
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
