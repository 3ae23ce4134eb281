// Native call sites: the watchdog finds the return addresses of records whose caller ran no
// Python frame and describes each once by module and offset.
#include "watchdog/native_sites.h"

#include <gtest/gtest.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "trace/ring_writer.h"

namespace ncclwatch::watchdog {
namespace {

__attribute__((noinline)) uint64_t aCallerOfNccl() {
  return reinterpret_cast<uint64_t>(__builtin_return_address(0));
}

trace::CallRecord callFrom(uint64_t site) {
  trace::CallRecord record{};
  record.op = trace::OpKind::kAllReduce;
  record.callSite = site;
  record.threadId = static_cast<int32_t>(syscall(SYS_gettid));
  return record;
}

std::string thisThreadsName() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

TEST(NativeSites, EachNewSiteIsDescribedOnceByModuleAndOffset) {
  trace::RingWriter writer;
  trace::RingOptions options;
  options.capacity = trace::kMinRingCapacity;
  writer.openInMemory(options, trace::ProcessInfo{});
  ASSERT_TRUE(writer.isOpen());
  const uint64_t site = aCallerOfNccl();
  writer.append(callFrom(site));
  writer.append(callFrom(trace::kPythonSiteTag | 3));  // a Python site: not ours to describe
  writer.append(callFrom(0));
  writer.append(callFrom(site));
  NativeSites sites;
  std::vector<trace::PythonSite> found = sites.scan(writer);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].number, trace::kNativeSiteNumber);
  EXPECT_EQ(found[0].nativeSite, site);
  ASSERT_EQ(found[0].frames.size(), 2u);
  // This test binary, at the offset of the return address from its load bias; then the thread
  // of the site's first call.
  EXPECT_NE(found[0].frames[0].find("native_sites_test+0x"), std::string::npos)
      << found[0].frames[0];
  EXPECT_EQ(found[0].frames[1], "thread " + thisThreadsName());
  writer.append(callFrom(site));
  EXPECT_TRUE(sites.scan(writer).empty()) << "described twice";
  // A burst that laps the ring: the newest ring's worth is scanned, the new site in it found.
  for (uint32_t i = 0; i < options.capacity + 10; ++i) writer.append(callFrom(site));
  writer.append(callFrom(site + 1));
  found = sites.scan(writer);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].nativeSite, site + 1);
}

TEST(NativeSites, AnAddressInNoModuleIsNotDescribed) {
  EXPECT_EQ(moduleOffsetText(8), "");
  EXPECT_NE(moduleOffsetText(static_cast<uintptr_t>(aCallerOfNccl())), "");
}

}  // namespace
}  // namespace ncclwatch::watchdog
