#include "record.h"

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
    case OpKind::kUnknown:
    case OpKind::kCount:
      break;
  }
  return "Unknown";
}

}  // namespace ncclwatch::trace
