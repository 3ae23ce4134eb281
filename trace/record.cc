#include "record.h"

#include "trace/ring_format.h"

#include <cstddef>
#include <cstdio>

namespace ncclwatch::trace {

const char* opName(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce:
      return "AllReduce";
    case OpKind::kBroadcast:
      return "Broadcast";
    case OpKind::kReduce:
      return "Reduce";
    case OpKind::kAllGather:
      return "AllGather";
    case OpKind::kReduceScatter:
      return "ReduceScatter";
    case OpKind::kAlltoAll:
      return "AlltoAll";
    case OpKind::kGather:
      return "Gather";
    case OpKind::kScatter:
      return "Scatter";
    case OpKind::kSend:
      return "Send";
    case OpKind::kRecv:
      return "Recv";
    case OpKind::kGroupStart:
      return "GroupStart";
    case OpKind::kGroupEnd:
      return "GroupEnd";
    case OpKind::kInit:
      return "Init";
    case OpKind::kSplit:
      return "Split";
    case OpKind::kShrink:
      return "Shrink";
    case OpKind::kFinalize:
      return "Finalize";
    case OpKind::kDestroy:
      return "Destroy";
    case OpKind::kAbort:
      return "Abort";
    case OpKind::kRevoke:
      return "Revoke";
    case OpKind::kRegister:
      return "Register";
    case OpKind::kDeregister:
      return "Deregister";
    case OpKind::kGrow:
      return "Grow";
    case OpKind::kPutSignal:
      return "PutSignal";
    case OpKind::kSignal:
      return "Signal";
    case OpKind::kWaitSignal:
      return "WaitSignal";
    case OpKind::kUnknown:
    case OpKind::kCount:
      break;
  }
  return "Unknown";
}

const char* dtypeName(int dtype) {
  static const char* const kNames[] = {"int8", "uint8", "int32",  "uint32",   "int64",   "uint64",
                                       "half", "float", "double", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return dtype >= 0 && dtype < 12 ? kNames[dtype] : "?";
}

int dtypeBytes(int dtype) {
  // In ncclDataType_t order, as dtypeName.
  static const int kBytes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return dtype >= 0 && dtype < 12 ? kBytes[dtype] : 0;
}

std::string redopName(int redop) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  if (redop >= 0 && redop < 5) return kNames[redop];
  if (redop == kRedopUnknown) return "?";
  return "premulsum#" + std::to_string(redop);
}

const char* stateName(RecordState state) {
  switch (state) {
    case RecordState::kEmpty:
      return "empty";
    case RecordState::kIssued:
      return "issued";
    case RecordState::kStarted:
      return "started";
    case RecordState::kCompleted:
      return "completed";
    case RecordState::kFailed:
      return "failed";
    case RecordState::kAborted:
      return "aborted";
  }
  return "?";
}

namespace {

const char* kernelText(KernelState state) {
  switch (state) {
    case KernelState::kNotStarted:
      return "kernel not started";
    case KernelState::kRunning:
      return "kernel running";
    case KernelState::kStopped:
      return "kernel finished";
    case KernelState::kUnknown:
      break;
  }
  return "kernel state unknown";
}

}  // namespace

uint32_t waitNoteCheck(const WaitNote& note) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&note);
  uint32_t hash = 2166136261u;
  for (size_t i = 0; i < offsetof(WaitNote, check); ++i) {
    hash = (hash ^ bytes[i]) * 16777619u;
  }
  return hash == 0 ? 1 : hash;
}

std::string describeWait(const trace::WaitNote& note, int64_t nowNs) {
  char text[256];
  int used = std::snprintf(text, sizeof text, "%s", kernelText(note.kernel));
  if (note.kernel != KernelState::kUnknown && note.nChannels > 0) {
    used += std::snprintf(text + used, sizeof text - used, " (%u of %u channels started",
                          note.channelsStarted, note.nChannels);
    if (note.channelsStopped > 0) {
      used += std::snprintf(text + used, sizeof text - used, ", %u finished", note.channelsStopped);
    }
    used += std::snprintf(text + used, sizeof text - used, ")");
  }
  double seconds = note.sinceNs > 0 && nowNs > note.sinceNs
                       ? static_cast<double>(nowNs - note.sinceNs) / 1e9
                       : 0.0;
  const char* state = proxyStepStateName(note.stepState);
  if (note.step >= 0 && state[0] != '\0') {
    std::snprintf(text + used, sizeof text - used,
                  "; channel %d proxy step %d %s %s peer %d for %.1f s", note.channel, note.step,
                  state, note.isSend ? "toward" : "from", note.peer, seconds);
  } else if (note.channel >= 0) {
    std::snprintf(text + used, sizeof text - used, "; channel %d, no proxy step pending (%.1f s)",
                  note.channel, seconds);
  }
  return text;
}

int proxyWaitWeight(uint8_t state) {
  switch (state) {
    case 8:   // SendGPUWait
    case 10:  // RecvWait
    case 20:  // SendPeerWait
      return 3;
    case 12:  // RecvGPUWait
      return 2;
    case 9:   // SendWait
    case 11:  // RecvFlushWait
      return 1;
  }
  return 0;
}

const char* proxyStepStateName(uint8_t state) {
  // NCCL's profiler state numbers (plugin/abi/profiler_abi.h); only the numbers are ABI.
  switch (state) {
    case 8:
      return "SendGPUWait";
    case 9:
      return "SendWait";
    case 10:
      return "RecvWait";
    case 11:
      return "RecvFlushWait";
    case 12:
      return "RecvGPUWait";
    case 20:
      return "SendPeerWait";
  }
  return "";
}

}  // namespace ncclwatch::trace
