// Finding the collector: the explicit address, the default one derived from MASTER_ADDR and
// MASTER_PORT (which must not land on torchrun's store or the examples' id rendezvous), `off`,
// and the secret derived from the first communicator's commHash. The host's relay: when it is
// wanted, the name every rank of the job on a host derives alike, and the claim only one rank
// of the host wins.
#include "watchdog/discovery.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cstddef>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "trace/abstract_socket.h"
#include "trace/identity.h"
#include "watchdog/relay_host.h"

namespace {

using ncclwatch::watchdog::CollectorAddress;
using ncclwatch::watchdog::DerivedSecretText;

struct Found {
  bool present = false;
  CollectorAddress address;
  std::string note;
};

Found find(const std::map<std::string, std::string>& environment) {
  Found found;
  auto lookup = [&environment](const char* name) -> const char* {
    auto entry = environment.find(name);
    return entry == environment.end() ? nullptr : entry->second.c_str();
  };
  found.present = ncclwatch::watchdog::collectorFromLookup(lookup, &found.address, &found.note);
  return found;
}

std::string secretOf(const std::vector<unsigned char>& id) {
  DerivedSecretText text;
  ncclwatch::trace::deriveSecret(id.data(), id.size(), text);
  return text;
}

std::vector<unsigned char> sampleId(unsigned char salt) {
  std::vector<unsigned char> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>(i * 37 + salt);
  return id;
}

TEST(CollectorAddress, NothingSetMeansNoCollector) {
  Found found = find({});
  EXPECT_FALSE(found.present);
  EXPECT_EQ(found.note, "");
  // MASTER_ADDR alone (no port to derive from) is not enough either, and says nothing.
  found = find({{"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_FALSE(found.present);
  EXPECT_EQ(found.note, "");
}

TEST(CollectorAddress, ExplicitAddressNeedsItsSecret) {
  Found found = find({{"NCCLWATCH_COLLECTOR", "node7:4100"}, {"NCCLWATCH_SECRET", "s3cret"}});
  ASSERT_TRUE(found.present) << found.note;
  EXPECT_EQ(found.address.host, "node7");
  EXPECT_EQ(found.address.port, 4100);
  EXPECT_EQ(found.address.secret, "s3cret");
  EXPECT_FALSE(found.address.fromMasterAddr);
  EXPECT_FALSE(found.address.secretFromUniqueId);

  found = find({{"NCCLWATCH_COLLECTOR", "[fe80::1]:4100"}, {"NCCLWATCH_SECRET", "s"}});
  ASSERT_TRUE(found.present) << found.note;
  EXPECT_EQ(found.address.host, "fe80::1");

  // No derived secret for an explicit address, even with MASTER_ADDR around.
  found = find(
      {{"NCCLWATCH_COLLECTOR", "node7:4100"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}});
  EXPECT_FALSE(found.present);
  EXPECT_NE(found.note.find("NCCLWATCH_SECRET"), std::string::npos) << found.note;

  for (const char* bad : {"node7", ":4100", "node7:", "node7:0", "node7:65536", "node7:41x"}) {
    found = find({{"NCCLWATCH_COLLECTOR", bad}, {"NCCLWATCH_SECRET", "s"}});
    EXPECT_FALSE(found.present) << bad;
    EXPECT_NE(found.note.find("is not host:port"), std::string::npos) << found.note;
  }
  found = find({{"NCCLWATCH_COLLECTOR", "node7:4100"}, {"NCCLWATCH_SECRET", std::string(64, 'x')}});
  EXPECT_FALSE(found.present);
  EXPECT_NE(found.note.find("longer than 63"), std::string::npos) << found.note;
}

TEST(CollectorAddress, DefaultIsMasterAddrAtMasterPortPlus17) {
  Found found = find({{"MASTER_ADDR", "node0.cluster"}, {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(found.present) << found.note;
  EXPECT_EQ(found.address.host, "node0.cluster");
  EXPECT_EQ(found.address.port, 29517);
  EXPECT_TRUE(found.address.fromMasterAddr);
  EXPECT_TRUE(found.address.secretFromUniqueId);
  EXPECT_EQ(found.address.secret, "");
  EXPECT_EQ(found.note, "");
}

TEST(CollectorAddress, DefaultPortAvoidsTheStoreAndTheIdRendezvous) {
  for (int master : {1, 2, 1024, 29500, 65518, 65519, 65534, 65535}) {
    int port = ncclwatch::watchdog::defaultCollectorPort(master);
    EXPECT_GE(port, 1) << master;
    EXPECT_LE(port, 65535) << master;
    EXPECT_NE(port, master) << master;      // torchrun's TCPStore
    EXPECT_NE(port, master + 1) << master;  // the examples' ncclUniqueId rendezvous
  }
  EXPECT_EQ(ncclwatch::watchdog::defaultCollectorPort(65518), 65535);
  EXPECT_EQ(ncclwatch::watchdog::defaultCollectorPort(65519), 65502);
  EXPECT_EQ(ncclwatch::watchdog::defaultCollectorPort(65535), 65518);
}

TEST(CollectorAddress, CollectorPortOverridesTheDefaultPort) {
  Found found = find({{"MASTER_ADDR", "10.1.2.3"},
                      {"MASTER_PORT", "29500"},
                      {"NCCLWATCH_COLLECTOR_PORT", "7000"}});
  ASSERT_TRUE(found.present) << found.note;
  EXPECT_EQ(found.address.port, 7000);
  // A bad one is said, and the default is used.
  found = find({{"MASTER_ADDR", "10.1.2.3"},
                {"MASTER_PORT", "29500"},
                {"NCCLWATCH_COLLECTOR_PORT", "99999"}});
  ASSERT_TRUE(found.present) << found.note;
  EXPECT_EQ(found.address.port, 29517);
  EXPECT_NE(found.note.find("NCCLWATCH_COLLECTOR_PORT=99999"), std::string::npos) << found.note;
  // Without MASTER_ADDR there is no default address to give the port to.
  EXPECT_FALSE(find({{"NCCLWATCH_COLLECTOR_PORT", "7000"}}).present);
}

TEST(CollectorAddress, BadMasterPortMeansNoCollector) {
  Found found = find({{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "twenty"}});
  EXPECT_FALSE(found.present);
  EXPECT_NE(found.note.find("MASTER_PORT=twenty"), std::string::npos) << found.note;
}

TEST(CollectorAddress, ExplicitSecretIsUsedWithTheDefaultAddress) {
  Found found =
      find({{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}, {"NCCLWATCH_SECRET", "mine"}});
  ASSERT_TRUE(found.present) << found.note;
  EXPECT_TRUE(found.address.fromMasterAddr);
  EXPECT_FALSE(found.address.secretFromUniqueId);
  EXPECT_EQ(found.address.secret, "mine");
}

TEST(CollectorAddress, OffDisablesEveryCollector) {
  for (const char* off : {"off", "OFF", "0", "none", "false"}) {
    Found found = find({{"NCCLWATCH_COLLECTOR", off},
                        {"NCCLWATCH_SECRET", "s"},
                        {"MASTER_ADDR", "10.1.2.3"},
                        {"MASTER_PORT", "29500"}});
    EXPECT_FALSE(found.present) << off;
    EXPECT_EQ(found.note, "") << off;
  }
}

TEST(DerivedSecret, Is32HexDigitsAndDeterministic) {
  std::string secret = secretOf(sampleId(1));
  ASSERT_EQ(secret.size(), 32u);
  for (char c : secret)
    EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(c));
  EXPECT_EQ(secretOf(sampleId(1)), secret);
  EXPECT_NE(secret.substr(0, 16), secret.substr(16));  // the halves are independent hashes
}

TEST(DerivedSecret, EveryByteOfTheIdCounts) {
  std::vector<unsigned char> id = sampleId(5);
  std::set<std::string> seen = {secretOf(id)};
  for (size_t byte = 0; byte < id.size(); ++byte) {
    for (unsigned char bit : {0x01, 0x80}) {
      std::vector<unsigned char> changed = id;
      changed[byte] ^= bit;
      std::string secret = secretOf(changed);
      // Each half changes on its own, so neither half can be matched separately.
      EXPECT_NE(secret.substr(0, 16), secretOf(id).substr(0, 16)) << byte;
      EXPECT_NE(secret.substr(16), secretOf(id).substr(16)) << byte;
      seen.insert(secret);
    }
  }
  EXPECT_EQ(seen.size(), 1 + 2 * id.size());
  // The all-zero id still gives a secret that is not all zeros.
  EXPECT_NE(secretOf(std::vector<unsigned char>(128, 0)), std::string(32, '0'));
}

TEST(DerivedSecret, SaysNothingAboutTheCommHash) {
  // Trace files and COMMS frames carry NCCL's commHash of the same id.
  std::vector<unsigned char> id = sampleId(9);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(ncclwatch::trace::rootCommHash(id.data(), 128)));
  std::string secret = secretOf(id);
  EXPECT_EQ(secret.find(hash), std::string::npos);
}

TEST(DerivedSecret, FirstOfferedHashWinsAndIsSeenByAnotherThread) {
  DerivedSecretText text;
  EXPECT_FALSE(ncclwatch::watchdog::derivedSecret(text));
  uint64_t firstHash = 0x1234'5678'9abc'def0ull, secondHash = 0x0fed'cba9'8765'4321ull;
  std::vector<unsigned char> first(sizeof firstHash);
  std::memcpy(first.data(), &firstHash, sizeof firstHash);
  std::thread reader([&] {
    DerivedSecretText seen;
    while (!ncclwatch::watchdog::derivedSecret(seen)) std::this_thread::yield();
    EXPECT_EQ(std::string(seen), secretOf(first));
  });
  ncclwatch::watchdog::offerCommHashForSecret(firstHash);
  reader.join();
  ncclwatch::watchdog::offerCommHashForSecret(secondHash);
  ASSERT_TRUE(ncclwatch::watchdog::derivedSecret(text));
  EXPECT_EQ(std::string(text), secretOf(first));
  // A fork child keeps a finished secret: it belongs to the same job.
  ncclwatch::watchdog::forgetUnfinishedSecretAfterFork();
  ASSERT_TRUE(ncclwatch::watchdog::derivedSecret(text));
  EXPECT_EQ(std::string(text), secretOf(first));
}

using ncclwatch::watchdog::RelayHost;
using ncclwatch::watchdog::RelayMode;

TEST(Relay, ModeComesFromNcclwatchRelayAndAutoFollowsTheWorldSize) {
  std::map<std::string, std::string> job = {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(find(job).address.relay, RelayMode::kAuto);
  for (const char* on : {"on", "1", "yes", "true"}) {
    job["NCCLWATCH_RELAY"] = on;
    EXPECT_EQ(find(job).address.relay, RelayMode::kOn) << on;
  }
  job["NCCLWATCH_RELAY"] = "off";
  EXPECT_EQ(find(job).address.relay, RelayMode::kOff);
  job["NCCLWATCH_RELAY"] = "sometimes";
  Found odd = find(job);
  EXPECT_EQ(odd.address.relay, RelayMode::kAuto);
  EXPECT_NE(odd.note.find("NCCLWATCH_RELAY=sometimes"), std::string::npos) << odd.note;
  // An explicit collector takes relays alike.
  Found explicitAddress =
      find({{"NCCLWATCH_COLLECTOR", "h:1"}, {"NCCLWATCH_SECRET", "s"}, {"NCCLWATCH_RELAY", "on"}});
  EXPECT_EQ(explicitAddress.address.relay, RelayMode::kOn);
  EXPECT_FALSE(ncclwatch::watchdog::relayWanted(RelayMode::kAuto, 63));
  EXPECT_TRUE(ncclwatch::watchdog::relayWanted(RelayMode::kAuto, 64));
  EXPECT_TRUE(ncclwatch::watchdog::relayWanted(RelayMode::kOn, 2));
  EXPECT_FALSE(ncclwatch::watchdog::relayWanted(RelayMode::kOff, 100000));
}

TEST(Relay, TheNameFollowsTheSecretAndTheCollector) {
  using ncclwatch::watchdog::relaySocketName;
  std::string name = relaySocketName("secret-a", "10.0.0.1", 29517);
  EXPECT_EQ(name, relaySocketName("secret-a", "10.0.0.1", 29517));  // every rank alike
  EXPECT_EQ(name.rfind("ncclwatch-relay-", 0), 0u) << name;
  EXPECT_EQ(name.size(), std::strlen("ncclwatch-relay-") + 16) << name;
  EXPECT_NE(name, relaySocketName("secret-b", "10.0.0.1", 29517));  // another job
  EXPECT_NE(name, relaySocketName("secret-a", "10.0.0.1", 29518));  // another collector
  EXPECT_NE(name, relaySocketName("secret-a", "10.0.0.2", 29517));
}

// The first rank to bind the host's name is the relay rank; another finds it taken and stays an
// agent. (The spawn itself fails here: no ncclwatch binary at that path, said in one line, and
// the name is free again for agents to find nobody and go direct.)
TEST(Relay, OneRankOfTheHostClaimsTheName) {
  std::string secret = "claim-" + std::to_string(getpid());
  ncclwatch::watchdog::RelayHostOptions options;
  options.collectorHost = "127.0.0.1";
  options.collectorPort = 9;
  options.cli = "/nonexistent/ncclwatch";
  std::string name = ncclwatch::watchdog::relaySocketName(secret, "127.0.0.1", 9);
  // Someone holds the name already (a relay running): this rank is not the relay rank.
  RelayHost second(options);
  int held = -1;
  {
    RelayHost first(options);
    first.step(secret.c_str());
    EXPECT_EQ(first.state(), RelayHost::State::kFailed);  // could not spawn: name released
    EXPECT_LT(ncclwatch::trace::connectToAbstractName(name), 0);
  }
  // Bind it as a relay would hold it, then let another rank try.
  held = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(held, 0);
  {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&address), length), 0);
    ASSERT_EQ(listen(held, 8), 0);
  }
  second.step(secret.c_str());
  EXPECT_EQ(second.state(), RelayHost::State::kOtherRank);
  int agent = ncclwatch::trace::connectToAbstractName(name);
  EXPECT_GE(agent, 0);  // agents of the host reach whoever holds it
  if (agent >= 0) close(agent);
  close(held);
  // No secret yet: nothing is claimed.
  RelayHost early(options);
  early.step(nullptr);
  EXPECT_EQ(early.state(), RelayHost::State::kWaiting);
}

}  // namespace
