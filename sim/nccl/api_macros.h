// Every API function is exported twice, as real NCCL does (reference §6.2): a weak ncclX that a
// tool may override, and a strong pncclX alias of the same code that the tool calls through.
#pragma once

#define NCCL_API(ret, func, ...)                                                  \
  extern "C" __attribute__((visibility("default"))) __attribute__((alias(#func))) \
  ret p##func(__VA_ARGS__);                                                       \
  extern "C" __attribute__((visibility("default"))) __attribute__((weak)) ret func(__VA_ARGS__)
