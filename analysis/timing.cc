#include "analysis/timing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_map>

#include "analysis/describe.h"

namespace ncclwatch::analysis {
namespace {

using trace::CallRecord;
using trace::TraceFile;

struct PairHash {
  size_t operator()(const std::pair<uint64_t, uint64_t>& key) const {
    return std::hash<uint64_t>()(key.first * 0x9e3779b97f4a7c15ULL ^ key.second);
  }
};

int64_t median(std::vector<int64_t> values) {
  if (values.empty()) return 0;
  size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  return values[middle];
}

// The p-th quantile (0..1) of sorted values, nearest rank.
int64_t quantile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

std::string lowerPlural(trace::OpKind op) {
  std::string name = trace::opName(op);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name + "s";
}

CommDesc describeComm(const TraceFile& file, const trace::CommInfo& info) {
  CommDesc desc;
  desc.hash = info.commHash;
  desc.size = info.nranks;
  desc.parent = info.parentHash;
  desc.color = info.color;
  desc.name.assign(info.name, strnlen(info.name, sizeof info.name));
  if (desc.name.empty() && desc.parent == 0 && file.header.world > 0 &&
      info.nranks == file.header.world) {
    desc.name = "world";
  }
  return desc;
}

}  // namespace

std::vector<CollectiveInstance> matchCollectives(std::span<const TraceFile> files) {
  std::unordered_map<std::pair<uint64_t, uint64_t>, size_t, PairHash> index;
  std::vector<CollectiveInstance> instances;
  for (size_t f = 0; f < files.size(); ++f) {
    const TraceFile& file = files[f];
    if (!file.usable) continue;
    std::unordered_map<uint64_t, int> sizes;
    for (const trace::CommInfo& info : file.comms) sizes[info.commHash] = info.nranks;
    std::unordered_map<uint64_t, uint64_t> p2pBefore;
    // Read once: the map updates below would make the compiler reload the window's fields.
    const trace::RecordRange records = file.records.range();
    for (size_t r = 0; r < records.size(); ++r) {
      const CallRecord& record = records[r];
      if (trace::isPointToPoint(record.op)) {
        ++p2pBefore[record.commHash];
        continue;
      }
      if (!trace::isCollective(record.op) || record.seq == 0) continue;
      uint64_t ordinal = record.seq - std::min(record.seq - 1, p2pBefore[record.commHash]);
      auto [it, fresh] = index.try_emplace({record.commHash, ordinal}, instances.size());
      if (fresh) {
        CollectiveInstance instance;
        instance.commHash = record.commHash;
        instance.ordinal = ordinal;
        instance.op = record.op;
        auto size = sizes.find(record.commHash);
        instance.commSize = size != sizes.end() ? size->second : 0;
        instances.push_back(std::move(instance));
      }
      CollectiveInstance& instance = instances[it->second];
      if (!instance.members.empty() && instance.members.back().file == f) continue;  // once each
      if (record.op != instance.op) instance.sameOp = false;
      instance.members.push_back({f, r});
    }
  }
  std::sort(instances.begin(), instances.end(),
            [](const CollectiveInstance& a, const CollectiveInstance& b) {
              return a.commHash != b.commHash ? a.commHash < b.commHash : a.ordinal < b.ordinal;
            });
  return instances;
}

int64_t ClockAlignment::aligned(size_t file, int64_t monotonicNs) const {
  if (monotonicNs == 0 || file >= hostOfFile.size() || hostOfFile[file] < 0) return monotonicNs;
  return monotonicNs + hosts[static_cast<size_t>(hostOfFile[file])].offsetNs;
}

int64_t ClockAlignment::correctionNs(size_t host) const {
  return hosts[host].offsetNs - hosts[host].wallOffsetNs;
}

ClockAlignment alignClocks(std::span<const TraceFile> files) {
  std::vector<CollectiveInstance> instances = matchCollectives(files);
  return alignClocks(files, instances);
}

ClockAlignment alignClocks(std::span<const TraceFile> files,
                           std::span<const CollectiveInstance> collectives) {
  ClockAlignment clocks;
  clocks.hostOfFile.assign(files.size(), -1);
  std::map<std::string, int> hostIndex;
  int referenceRank = INT32_MAX;
  int reference = -1;
  for (size_t f = 0; f < files.size(); ++f) {
    const TraceFile& file = files[f];
    if (!file.usable) continue;
    std::string host(file.header.host, strnlen(file.header.host, sizeof file.header.host));
    auto [it, fresh] = hostIndex.try_emplace(host, static_cast<int>(clocks.hosts.size()));
    if (fresh) clocks.hosts.push_back({host, {}, 0, 0, 0, false});
    clocks.hostOfFile[f] = it->second;
    clocks.hosts[static_cast<size_t>(it->second)].files.push_back(f);
    int rank = file.header.rank >= 0 ? file.header.rank : INT32_MAX - 1;
    if (reference < 0 || rank < referenceRank) {
      referenceRank = rank;
      reference = it->second;
    }
  }
  for (HostClock& host : clocks.hosts) {
    std::vector<int64_t> walls;
    for (size_t f : host.files) {
      walls.push_back(files[f].header.anchorRealtimeNs - files[f].header.anchorMonotonicNs);
    }
    host.wallOffsetNs = host.offsetNs = median(walls);
  }
  if (reference < 0) return clocks;
  clocks.hosts[static_cast<size_t>(reference)].reference = true;
  size_t hostCount = clocks.hosts.size();
  if (hostCount < 2) return clocks;

  // Per collective shared by two hosts or more: each host's median completion (its own clock).
  struct Shared {
    std::vector<std::pair<int, int64_t>> hostCompletion;
  };
  std::vector<Shared> shared;
  for (const CollectiveInstance& instance : collectives) {
    if (!instance.sameOp) continue;
    std::map<int, std::vector<int64_t>> byHost;
    for (const CollectiveInstance::Member& m : instance.members) {
      const CallRecord& r = files[m.file].records[m.record];
      if (r.state != trace::RecordState::kCompleted || r.completeNs == 0) continue;
      byHost[clocks.hostOfFile[m.file]].push_back(r.completeNs);
    }
    if (byHost.size() < 2) continue;
    Shared s;
    for (auto& [host, times] : byHost) s.hostCompletion.push_back({host, median(times)});
    shared.push_back(std::move(s));
  }
  // Gauss-Seidel: each host in turn takes the offset that best aligns it with the others as they
  // stand; with two hosts one round is exact, more converge in a few.
  for (int round = 0; round < 16; ++round) {
    int64_t largestChange = 0;
    for (size_t h = 0; h < hostCount; ++h) {
      if (clocks.hosts[h].reference) continue;
      std::vector<int64_t> samples;
      for (const Shared& s : shared) {
        int64_t mine = 0;
        std::vector<int64_t> others;
        for (const auto& [host, time] : s.hostCompletion) {
          if (static_cast<size_t>(host) == h) {
            mine = time;
          } else {
            others.push_back(time + clocks.hosts[static_cast<size_t>(host)].offsetNs);
          }
        }
        if (mine == 0 || others.empty()) continue;
        samples.push_back(median(std::move(others)) - mine);
      }
      if (samples.empty()) continue;
      int64_t offset = median(samples);
      largestChange =
          std::max<int64_t>(largestChange, std::llabs(offset - clocks.hosts[h].offsetNs));
      clocks.hosts[h].offsetNs = offset;
      clocks.hosts[h].collectives = samples.size();
    }
    if (largestChange < 100) break;
  }
  return clocks;
}

StragglerReport computeStragglers(std::span<const TraceFile> files,
                                  const StragglerOptions& options) {
  StragglerReport report;
  std::vector<CollectiveInstance> instances = matchCollectives(files);
  report.clocks = alignClocks(files, instances);
  for (const TraceFile& file : files) report.ranks += file.usable;

  struct Acc {
    CommDesc desc;
    std::map<size_t, std::vector<int64_t>> lateness;  // per file
    std::map<size_t, int> last;
    std::map<trace::OpKind, int> ops;
    int collectives = 0;
  };
  std::map<uint64_t, Acc> comms;
  std::vector<int64_t> issue;
  for (const CollectiveInstance& instance : instances) {
    if (!instance.sameOp || instance.commSize < 2 ||
        instance.members.size() != static_cast<size_t>(instance.commSize)) {
      continue;
    }
    issue.clear();
    int64_t earliest = INT64_MAX, latest = INT64_MIN;
    int latestCount = 0;
    size_t latestFile = 0;
    for (const CollectiveInstance::Member& m : instance.members) {
      int64_t t = report.clocks.aligned(m.file, files[m.file].records[m.record].issueNs);
      issue.push_back(t);
      earliest = std::min(earliest, t);
      if (t > latest) {
        latest = t;
        latestCount = 1;
        latestFile = m.file;
      } else if (t == latest) {
        ++latestCount;
      }
    }
    Acc& acc = comms[instance.commHash];
    if (acc.collectives == 0) {
      const TraceFile& file = files[instance.members.front().file];
      for (const trace::CommInfo& info : file.comms) {
        if (info.commHash == instance.commHash) acc.desc = describeComm(file, info);
      }
      acc.desc.hash = instance.commHash;
      acc.desc.size = instance.commSize;
    }
    ++acc.collectives;
    ++acc.ops[instance.op];
    for (size_t i = 0; i < instance.members.size(); ++i) {
      acc.lateness[instance.members[i].file].push_back(issue[i] - earliest);
    }
    if (latestCount == 1) ++acc.last[latestFile];
  }

  for (auto& [hash, acc] : comms) {
    CommLateness comm;
    comm.comm = acc.desc;
    comm.collectives = acc.collectives;
    comm.what = acc.ops.size() == 1 ? lowerPlural(acc.ops.begin()->first) : "collectives";
    for (auto& [file, values] : acc.lateness) {
      std::sort(values.begin(), values.end());
      RankLateness r;
      r.rank = files[file].header.rank;
      r.file = file;
      r.calls = static_cast<int>(values.size());
      r.last = acc.last[file];
      r.medianNs = quantile(values, 0.5);
      r.p95Ns = quantile(values, 0.95);
      r.maxNs = values.back();
      comm.ranks.push_back(r);
    }
    std::sort(comm.ranks.begin(), comm.ranks.end(),
              [](const RankLateness& a, const RankLateness& b) {
                return a.rank != b.rank ? a.rank < b.rank : a.file < b.file;
              });
    for (const RankLateness& r : comm.ranks) {
      if (r.calls < options.minCalls || r.lastShare() < options.minLastShare ||
          r.medianNs < options.minMedianNs) {
        continue;
      }
      Straggler s;
      s.rank = r.rank;
      s.commHash = hash;
      s.lastShare = r.lastShare();
      s.medianNs = r.medianNs;
      char share[16];
      std::snprintf(share, sizeof share, "%.0f%%", 100.0 * s.lastShare);
      s.reading = "rank " + std::to_string(r.rank) + " arrives last in " + share + " of " +
                  comm.what + " on comm " + commText(comm.comm) + ", " + durationText(r.medianNs) +
                  " late at the median: it is the straggler the others wait for";
      report.stragglers.push_back(std::move(s));
    }
    report.comms.push_back(std::move(comm));
  }
  std::stable_sort(report.stragglers.begin(), report.stragglers.end(),
                   [](const Straggler& a, const Straggler& b) {
                     double wa = a.lastShare * static_cast<double>(a.medianNs);
                     double wb = b.lastShare * static_cast<double>(b.medianNs);
                     return wa != wb ? wa > wb : a.rank < b.rank;
                   });
  return report;
}

std::string durationText(int64_t ns) {
  char text[32];
  int64_t magnitude = std::llabs(ns);
  if (magnitude < 1000) {
    std::snprintf(text, sizeof text, "%lld ns", static_cast<long long>(ns));
  } else if (magnitude < 1'000'000) {
    std::snprintf(text, sizeof text, "%.0f us", static_cast<double>(ns) / 1e3);
  } else if (magnitude < 1'000'000'000) {
    std::snprintf(text, sizeof text, "%.1f ms", static_cast<double>(ns) / 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.2f s", static_cast<double>(ns) / 1e9);
  }
  return text;
}

}  // namespace ncclwatch::analysis
