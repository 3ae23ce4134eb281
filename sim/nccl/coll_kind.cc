// Names and properties of the collectives (pure, shared with the tests).
#include "shm.h"

namespace ncclsim {

const char* collKindName(CollKind kind) {
  switch (kind) {
    case CollKind::kAllReduce:
      return "AllReduce";
    case CollKind::kBroadcast:
      return "Broadcast";
    case CollKind::kReduce:
      return "Reduce";
    case CollKind::kAllGather:
      return "AllGather";
    case CollKind::kReduceScatter:
      return "ReduceScatter";
    case CollKind::kAlltoAll:
      return "AlltoAll";
    case CollKind::kGather:
      return "Gather";
    case CollKind::kScatter:
      return "Scatter";
  }
  return "?";
}

bool collKindHasRoot(CollKind kind) {
  return kind == CollKind::kBroadcast || kind == CollKind::kReduce || kind == CollKind::kGather ||
         kind == CollKind::kScatter;
}

bool collKindReduces(CollKind kind) {
  return kind == CollKind::kAllReduce || kind == CollKind::kReduce ||
         kind == CollKind::kReduceScatter;
}

}  // namespace ncclsim
