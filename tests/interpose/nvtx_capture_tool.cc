// An NVTX injection tool for tests: loaded by NVTX from NVTX_INJECTION64_PATH, it takes over
// domain creation and domain push/pop and appends one line per event to the file named by
// NVTX_CAPTURE_FILE:
//   <pid> init
//   <pid> domain <name>
//   <pid> push <domain> category=<n> payload=<u64 or -> <message>
//   <pid> pop <domain>
// Every line is one write() to an O_APPEND file, so processes and threads may share the file.
#include <fcntl.h>
#include <nvtx3/nvToolsExt.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

int g_fd = -1;

// A domain handle is a pointer to the domain's name, which lives as long as the process.
std::mutex g_domainsLock;
std::vector<std::string*>* g_domains = nullptr;

void emit(const std::string& event) {
  if (g_fd < 0) return;
  std::string line = std::to_string(getpid()) + " " + event + "\n";
  ssize_t written = write(g_fd, line.data(), line.size());
  (void)written;
}

const char* domainName(nvtxDomainHandle_t domain) {
  if (domain == nullptr) return "(default)";
  return reinterpret_cast<const std::string*>(domain)->c_str();
}

nvtxDomainHandle_t NVTX_API domainCreateA(const char* name) {
  std::lock_guard<std::mutex> lock(g_domainsLock);
  if (g_domains == nullptr) g_domains = new std::vector<std::string*>;
  for (std::string* known : *g_domains) {
    if (*known == name) return reinterpret_cast<nvtxDomainHandle_t>(known);
  }
  g_domains->push_back(new std::string(name != nullptr ? name : ""));
  emit("domain " + *g_domains->back());
  return reinterpret_cast<nvtxDomainHandle_t>(g_domains->back());
}

int NVTX_API domainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attrib) {
  std::string event = std::string("push ") + domainName(domain);
  if (attrib == nullptr) {
    emit(event + " category=0 payload=- ");
    return 0;
  }
  event += " category=" + std::to_string(attrib->category);
  event += " payload=";
  event += attrib->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64
               ? std::to_string(attrib->payload.ullValue)
               : std::string("-");
  event += " ";
  if (attrib->messageType == NVTX_MESSAGE_TYPE_ASCII && attrib->message.ascii != nullptr) {
    event += attrib->message.ascii;
  }
  emit(event);
  return 0;
}

int NVTX_API domainRangePop(nvtxDomainHandle_t domain) {
  emit(std::string("pop ") + domainName(domain));
  return 0;
}

bool install(NvtxFunctionTable table, unsigned int size, unsigned int id,
             NvtxFunctionPointer function) {
  if (table == nullptr || id > size || table[id] == nullptr) return false;  // size + 1 slots
  *table[id] = function;
  return true;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t getExportTable) {
  if (getExportTable == nullptr) return 0;
  auto callbacks =
      static_cast<const NvtxExportTableCallbacks*>(getExportTable(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(NvtxExportTableCallbacks) ||
      callbacks->GetModuleFunctionTable == nullptr) {
    return 0;
  }
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) == 0) return 0;
  if (const char* path = std::getenv("NVTX_CAPTURE_FILE")) {
    g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  }
  bool ok = install(table, size, NVTX_CBID_CORE2_DomainCreateA,
                    reinterpret_cast<NvtxFunctionPointer>(&domainCreateA)) &&
            install(table, size, NVTX_CBID_CORE2_DomainRangePushEx,
                    reinterpret_cast<NvtxFunctionPointer>(&domainRangePushEx)) &&
            install(table, size, NVTX_CBID_CORE2_DomainRangePop,
                    reinterpret_cast<NvtxFunctionPointer>(&domainRangePop));
  emit(ok ? "init" : "init failed");
  return ok ? 1 : 0;
}
