// Checks a Chrome/Perfetto trace-event JSON document the way a viewer depends on it: valid JSON,
// a traceEvents array, the fields every event needs, complete slices with a duration >= 0 that
// nest on each track (a viewer drops slices that partially overlap), every B matched by an E.
#pragma once
#include <simdjson.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace tracecheck {

struct Summary {
  std::string error;  // empty: valid
  size_t events = 0, slices = 0, instants = 0, metadata = 0;
  std::map<std::string, size_t> byCategory;  // X and i events per cat
  std::vector<std::string> processNames;
};

inline Summary check(const std::string& json) {
  Summary s;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(json).get(doc) != simdjson::SUCCESS) {
    s.error = "not valid JSON";
    return s;
  }
  simdjson::dom::array events;
  if (doc["traceEvents"].get_array().get(events) != simdjson::SUCCESS) {
    s.error = "no traceEvents array";
    return s;
  }
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<double, double>>> slices;
  std::map<std::tuple<int64_t, int64_t>, int> open;
  for (simdjson::dom::element e : events) {
    ++s.events;
    std::string_view ph, name;
    int64_t pid = 0, tid = 0;
    if (e["ph"].get_string().get(ph) != simdjson::SUCCESS ||
        e["name"].get_string().get(name) != simdjson::SUCCESS ||
        e["pid"].get_int64().get(pid) != simdjson::SUCCESS ||
        e["tid"].get_int64().get(tid) != simdjson::SUCCESS) {
      s.error = "event " + std::to_string(s.events) + " lacks ph, name, pid or tid";
      return s;
    }
    if (ph == "M") {
      ++s.metadata;
      std::string_view value;
      if (name == "process_name" && e["args"]["name"].get_string().get(value) == simdjson::SUCCESS)
        s.processNames.emplace_back(value);
      continue;
    }
    double ts = 0;
    if (e["ts"].get_double().get(ts) != simdjson::SUCCESS) {
      s.error = "event " + std::to_string(s.events) + " (" + std::string(name) + ") lacks ts";
      return s;
    }
    std::string_view cat = "";
    if (e["cat"].get_string().get(cat) != simdjson::SUCCESS) cat = "";
    if (ph == "X") {
      double dur = -1;
      if (e["dur"].get_double().get(dur) != simdjson::SUCCESS || dur < 0) {
        s.error = "X event " + std::string(name) + " without a duration >= 0";
        return s;
      }
      ++s.slices;
      ++s.byCategory[std::string(cat)];
      slices[{pid, tid}].push_back({ts, ts + dur});
    } else if (ph == "i" || ph == "I") {
      ++s.instants;
      ++s.byCategory[std::string(cat)];
    } else if (ph == "B") {
      ++open[{pid, tid}];
    } else if (ph == "E") {
      if (--open[{pid, tid}] < 0) {
        s.error = "E without B";
        return s;
      }
    }
  }
  for (const auto& [track, count] : open) {
    if (count != 0) {
      s.error = "B without E";
      return s;
    }
  }
  // Slices of one track nest: sorted by start (longer first), each either ends before the next
  // starts or contains it.
  for (auto& [track, list] : slices) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<double> stack;
    for (const auto& [start, end] : list) {
      while (!stack.empty() && stack.back() <= start + 1e-6) stack.pop_back();
      if (!stack.empty() && end > stack.back() + 1e-6) {
        s.error = "slices overlap without nesting on pid " + std::to_string(track.first) + " tid " +
                  std::to_string(track.second) + " at ts " + std::to_string(start);
        return s;
      }
      stack.push_back(end);
    }
  }
  return s;
}

}  // namespace tracecheck
