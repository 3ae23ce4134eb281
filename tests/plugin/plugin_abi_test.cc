// libncclwatch.so as NCCL's loader sees it: dlopen(RTLD_NOW | RTLD_LOCAL), dlsym of every
// ncclProfiler_vN table, and their shapes. Then, for each ABI version, this test plays NCCL
// (in a child process per version: the plugin's state is per process) and drives a small
// call sequence through that version's table; the trace file it leaves must hold the same
// records whichever version carried them, with the states the KernelCh events imply and a
// wait note naming the proxy step a pending send waits on.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "plugin/abi/profiler_abi.h"
#include "tests/support/traces.h"
#include "trace/ring_reader.h"

namespace {

namespace abi = nccl_profiler_abi;
using ncclwatch::trace::CallRecord;
using ncclwatch::trace::OpKind;
using ncclwatch::trace::RecordState;

constexpr uint64_t kCommHash = 0x5eed'cafe'f00d'0001ull;

void* openAsNccl() {
  return dlopen(NCCLWATCH_PRELOAD, RTLD_NOW | RTLD_LOCAL);
}

TEST(PluginTables, EveryVersionIsExportedWithItsShape) {
  void* library = openAsNccl();
  ASSERT_NE(library, nullptr) << dlerror();
  for (const char* name : {"ncclProfiler_v7", "ncclProfiler_v6", "ncclProfiler_v5"}) {
    auto* table = static_cast<abi::ProfilerV5*>(dlsym(library, name));
    ASSERT_NE(table, nullptr) << name;
    EXPECT_STREQ(table->name, "ncclwatch");
    EXPECT_NE(table->init, nullptr);
    EXPECT_NE(table->startEvent, nullptr);
    EXPECT_NE(table->stopEvent, nullptr);
    EXPECT_NE(table->recordEventState, nullptr);
    EXPECT_NE(table->finalize, nullptr);
  }
  // v7 ends with one null pointer beyond NCCL's six members.
  auto* v7 = static_cast<abi::ProfilerV7*>(dlsym(library, "ncclProfiler_v7"));
  EXPECT_EQ(v7->reservedTrailing, nullptr);
  auto* v4 = static_cast<abi::ProfilerV4*>(dlsym(library, "ncclProfiler_v4"));
  ASSERT_NE(v4, nullptr);
  EXPECT_NE(v4->init, nullptr);
  EXPECT_NE(v4->startEvent, nullptr);
  auto* v3 = static_cast<abi::ProfilerV3*>(dlsym(library, "ncclProfiler_v3"));
  ASSERT_NE(v3, nullptr);
  EXPECT_NE(v3->init, nullptr);
  // Versions NCCL 2.23-2.25 speak are not offered: their records would have no communicator.
  EXPECT_EQ(dlsym(library, "ncclProfiler_v2"), nullptr);
  EXPECT_EQ(dlsym(library, "ncclProfiler_v1"), nullptr);
  // The sizes NCCL copies (it reads the tables through these pointers).
  static_assert(sizeof(abi::ProfilerV5) == 48 && sizeof(abi::ProfilerV4) == 48 &&
                sizeof(abi::ProfilerV3) == 48);
}

// What the test's "NCCL" hands every version: one call sequence, described once.
struct Call {
  const char* apiFunc;
  uint64_t apiCount;
  const char* apiType;
  const char* opFunc;
  uint64_t opCount;
  const char* opType;
  int peer;
  int nChannels;
  bool finishes;  // its kernel channels stop
};

const Call kCalls[] = {
    {"AllReduce", 1024, "ncclFloat32", "AllReduce", 1024, "ncclFloat32", -1, 2, true},
    // NCCL's Coll event reports AllGather in bytes of int8; its API event has the user's view.
    {"AllGather", 8, "ncclFloat32", "AllGather", 32, "ncclInt8", -1, 2, true},
    {"Send", 16, "ncclBfloat16", "Send", 16, "ncclBfloat16", 0, 1, false},
};

bool traceHasWaitNote(const std::string& dir) {
  try {
    std::vector<ncclwatch::trace::TraceFile> files = testsupport::readTraceFiles(dir);
    return files.size() == 1 && !files[0].waits.empty();
  } catch (const std::exception&) {
    return false;  // the file is still being created
  }
}

// Plays NCCL of one ABI version against the library; returns the process exit code (0 ok).
class FakeNccl {
 public:
  FakeNccl(void* library, int version) : library_(library), version_(version) {}

  int run(const std::string& traceDir) {
    void* context = nullptr;
    int mask = 0;
    if (!init(&context, &mask)) return 10;
    if (context == nullptr) return 11;
    if ((mask & abi::kKernelCh) == 0 || (mask & abi::kColl) == 0) return 12;
    void* pending = nullptr;
    for (int i = 0; i < 3; ++i) {
      void* op = issue(context, kCalls[i], static_cast<uint64_t>(i));
      if (op == nullptr) return 13;
      for (int channel = 0; channel < kCalls[i].nChannels; ++channel) {
        void* kernel = start(context, kernelCh(op, channel));
        if (kernel == nullptr) return 14;
        if (kCalls[i].finishes) {
          stopKernel(kernel);
        }
      }
      if (!kCalls[i].finishes) pending = op;
    }
    // A proxy op and a step for the pending send: the step waits for the peer's credit.
    void* proxy = start(context, proxyOp(pending, getpid(), 0, 0, true));
    void* step = start(context, proxyStep(proxy, 3));
    if (proxy == nullptr || step == nullptr) return 15;
    state(step, abi::kProxyStepSendPeerWait);
    // PXN: another process's proxy op, whose parent is an address of that process.
    start(context, proxyOp(reinterpret_cast<void*>(0x10), getpid() + 1, 1, 1, true));
    // A child of a dropped (null) parent is harmless.
    start(context, kernelCh(nullptr, 0));
    // The watchdog thread (polling every 10 ms here) writes the wait note once the step has
    // waited 200 ms; a loaded or sanitized machine can take seconds to get there, so wait for
    // the note itself, 30 s at most, instead of a fixed time.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline && !traceHasWaitNote(traceDir)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }

 private:
  bool init(void** context, int* mask) {
    if (version_ >= 5) {
      auto* table = static_cast<abi::ProfilerV5*>(
          dlsym(library_, ("ncclProfiler_v" + std::to_string(version_)).c_str()));
      return table->init(context, kCommHash, mask, "testcomm", 1, 2, 1, nullptr) == ncclSuccess;
    }
    if (version_ == 4) {
      auto* table = static_cast<abi::ProfilerV4*>(dlsym(library_, "ncclProfiler_v4"));
      return table->init(context, mask, "testcomm", kCommHash, 1, 2, 1, nullptr) == ncclSuccess;
    }
    auto* table = static_cast<abi::ProfilerV3*>(dlsym(library_, "ncclProfiler_v3"));
    return table->init(context, mask) == ncclSuccess;
  }

  // An event described in the newest layout; converted to the version's layout when started.
  struct Event {
    abi::EventDescr descr{};
  };

  Event kernelCh(void* parent, int channel) {
    Event e;
    e.descr.type = abi::kKernelCh;
    e.descr.parentObj = parent;
    e.descr.kernelCh.channelId = static_cast<uint8_t>(channel);
    return e;
  }
  Event proxyOp(void* parent, pid_t pid, int channel, int peer, bool send) {
    Event e;
    e.descr.type = abi::kProxyOp;
    e.descr.parentObj = parent;
    e.descr.rank = 1;
    e.descr.proxyOp = {pid, static_cast<uint8_t>(channel), peer, 8, 1 << 16, send ? 1 : 0};
    return e;
  }
  Event proxyStep(void* parent, int step) {
    Event e;
    e.descr.type = abi::kProxyStep;
    e.descr.parentObj = parent;
    e.descr.rank = 1;
    e.descr.proxyStep.step = step;
    return e;
  }

  void* issue(void* context, const Call& call, uint64_t seqNumber) {
    bool p2p = call.peer >= 0;
    void* api = nullptr;
    if (version_ >= 5) {
      Event group;
      group.descr.type = abi::kGroupApi;
      group.descr.groupApi.groupDepth = 1;
      void* groupHandle = start(context, group);
      Event e;
      e.descr.type = p2p ? abi::kP2pApi : abi::kCollApi;
      e.descr.parentObj = groupHandle;
      if (p2p) {
        e.descr.p2pApi = {
            call.apiFunc, call.apiCount, call.apiType, reinterpret_cast<void*>(0x40), false, 0};
      } else {
        e.descr.collApi = {
            call.apiFunc, call.apiCount, call.apiType, -1, reinterpret_cast<void*>(0x40), false, 0};
      }
      api = start(context, e);
      stop(api);
      stop(groupHandle);
    }
    Event op;
    op.descr.type = p2p ? abi::kP2p : abi::kColl;
    op.descr.parentObj = api;
    op.descr.rank = 1;
    if (p2p) {
      op.descr.p2p = {call.opFunc,  nullptr,   call.opType,
                      call.opCount, call.peer, static_cast<uint8_t>(call.nChannels),
                      nullptr,      0};
    } else {
      op.descr.coll = {seqNumber,
                       call.opFunc,
                       nullptr,
                       nullptr,
                       call.opCount,
                       -1,
                       call.opType,
                       static_cast<uint8_t>(call.nChannels),
                       8,
                       "RING",
                       "SIMPLE",
                       nullptr,
                       nullptr,
                       false,
                       0};
    }
    void* handle = start(context, op);
    stop(handle);
    return handle;
  }

  void* start(void* context, const Event& event) {
    void* handle = reinterpret_cast<void*>(0x1);  // must be overwritten, even with null
    if (version_ >= 5) {
      auto* table = static_cast<abi::ProfilerV5*>(dlsym(library_, name().c_str()));
      abi::EventDescr descr = event.descr;
      table->startEvent(context, &handle, &descr);
    } else if (version_ == 4) {
      auto* table = static_cast<abi::ProfilerV4*>(dlsym(library_, "ncclProfiler_v4"));
      abi::EventDescrV4 descr;
      if (!abi::toV4(event.descr, &descr)) return nullptr;
      table->startEvent(context, &handle, &descr);
    } else {
      auto* table = static_cast<abi::ProfilerV3*>(dlsym(library_, "ncclProfiler_v3"));
      abi::EventDescrV3 descr;
      if (!abi::toV3(event.descr, kCommHash, &descr)) return nullptr;
      table->startEvent(context, &handle, &descr);
    }
    if (handle == reinterpret_cast<void*>(0x1)) std::abort();  // the plugin left it unwritten
    return handle;
  }
  void stop(void* handle) {
    auto* table = static_cast<abi::ProfilerV5*>(dlsym(library_, name().c_str()));
    table->stopEvent(handle);
  }
  void state(void* handle, int eventState) {
    if (version_ == 3) {
      auto* table = static_cast<abi::ProfilerV3*>(dlsym(library_, "ncclProfiler_v3"));
      table->recordEventState(handle, eventState, nullptr);
      return;
    }
    auto* table = static_cast<abi::ProfilerV5*>(dlsym(library_, name().c_str()));
    abi::StateArgs args{};
    table->recordEventState(handle, eventState, &args);
  }
  void stopKernel(void* handle) {
    auto* table = static_cast<abi::ProfilerV5*>(dlsym(library_, name().c_str()));
    abi::StateArgs args{};
    args.kernelCh.pTimer = 12345;
    if (version_ == 3) {
      table->stopEvent(handle);  // v3 has no KernelChStop state: the stop alone
      return;
    }
    table->recordEventState(handle, abi::kKernelChStop, &args);
    table->stopEvent(handle);
  }

  std::string name() const { return "ncclProfiler_v" + std::to_string(version_); }

  void* library_;
  int version_;
};

class PluginVersion : public testing::TestWithParam<int> {};

TEST_P(PluginVersion, RecordsTheSameCallsWithKernelStatesAndWaitNotes) {
  int version = GetParam();
  std::string dir = testsupport::freshDirectory("plugin-v" + std::to_string(version));
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("NCCLWATCH_DIR", dir.c_str(), 1);
    setenv("NCCLWATCH_COLLECTOR", "off", 1);
    setenv("NCCLWATCH_POLL_MS", "10", 1);
    setenv("NCCLWATCH_EVENTS", "0", 1);  // no CUDA driver needed: the plugin tracks completion
    setenv("RANK", "1", 1);
    void* library = openAsNccl();
    if (library == nullptr) _exit(9);
    FakeNccl nccl(library, version);
    int code = nccl.run(dir);
    std::fflush(stderr);
    _exit(code);  // no exit handlers: the trace is the mapping as it stands
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the fake NCCL died of signal " << WTERMSIG(status);
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the fake NCCL failed at step " << WEXITSTATUS(status);

  std::vector<ncclwatch::trace::TraceFile> files = testsupport::readTraceFiles(dir);
  ASSERT_EQ(files.size(), 1u);
  const ncclwatch::trace::TraceFile& file = files[0];
  EXPECT_NE(file.header.recordingSources & ncclwatch::trace::kSourcePlugin, 0u);
  if (version >= 4) {
    ASSERT_EQ(file.comms.size(), 1u);
    EXPECT_EQ(file.comms[0].commHash, kCommHash);
  }  // v3 never tells a communicator's size: its table entry is not a valid one
  std::vector<CallRecord> calls;
  for (const CallRecord& record : file.records) {
    EXPECT_EQ(record.commHash, kCommHash);
    EXPECT_NE(record.flags & ncclwatch::trace::kRecordFromPlugin, 0);
    if (record.op != OpKind::kInit) calls.push_back(record);
  }
  EXPECT_EQ(file.records.size(), calls.size() + 1);  // and the init record
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].op, OpKind::kAllReduce);
  EXPECT_EQ(calls[0].count, 1024u);
  EXPECT_EQ(calls[0].dtype, 7);  // ncclFloat32
  EXPECT_EQ(calls[0].redop, ncclwatch::trace::kRedopUnknown);
  EXPECT_EQ(calls[0].state, RecordState::kCompleted);
  EXPECT_EQ(calls[1].op, OpKind::kAllGather);
  if (version >= 5) {
    EXPECT_EQ(calls[1].count, 8u);  // the user's view, from the API event
    EXPECT_EQ(calls[1].dtype, 7);
  } else {
    EXPECT_EQ(calls[1].count, 32u);  // NCCL's bytes of int8: no API event before v5
    EXPECT_EQ(calls[1].dtype, 0);
  }
  EXPECT_EQ(calls[1].state, RecordState::kCompleted);
  EXPECT_EQ(calls[2].op, OpKind::kSend);
  EXPECT_EQ(calls[2].rootOrPeer, 0);
  EXPECT_EQ(calls[2].dtype, 9);                        // ncclBfloat16
  EXPECT_EQ(calls[2].p2pSeq, version >= 4 ? 1u : 0u);  // per-peer counters need the size
  EXPECT_EQ(calls[2].state, RecordState::kStarted);    // its kernel started, never stopped
  for (int i = 0; i < 3; ++i) EXPECT_EQ(calls[i].seq, static_cast<uint64_t>(i + 1));
  if (version >= 5) {
    EXPECT_EQ(calls[0].stream, 0x40u);
  }

  ASSERT_EQ(file.waits.size(), 1u);
  const ncclwatch::trace::WaitNote& note = file.waits[0];
  EXPECT_EQ(note.seq, calls[2].seq);
  EXPECT_EQ(note.kernel, ncclwatch::trace::KernelState::kRunning);
  EXPECT_EQ(note.step, 3);
  EXPECT_EQ(note.peer, 0);
  EXPECT_EQ(note.isSend, 1);
  EXPECT_EQ(note.stepState, abi::kProxyStepSendPeerWait);
  std::string text = ncclwatch::trace::describeWait(note, note.updatedNs);
  EXPECT_NE(text.find("SendPeerWait toward peer 0"), std::string::npos) << text;
}

INSTANTIATE_TEST_SUITE_P(AbiVersions, PluginVersion, testing::Values(7, 6, 5, 4, 3),
                         [](const testing::TestParamInfo<int>& info) {
                           return "v" + std::to_string(info.param);
                         });

}  // namespace
