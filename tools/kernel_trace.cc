// Kernel timeline recorder for profiling without Nsight Systems: a CUDA injection library.
// The CUDA driver loads it when CUDA_INJECTION64_PATH names it and calls InitializeInjection;
// it records every kernel (graph nodes included) through CUPTI's activity API and writes one
// CSV line per kernel, "device,stream,start_ns,end_ns,name", to $MOESERVE_KERNEL_TRACE at exit.
//
// Build (not part of the CMake build: it needs CUPTI headers, which the CUDA toolkit here
// lacks; any CUPTI 13 headers do, e.g. the ones triton ships):
//   g++ -O2 -shared -fPIC -std=c++17 -I$CUPTI_INCLUDE -I/usr/local/cuda/include \
//       tools/kernel_trace.cc -o carry/libkernel_trace.so -L$CUPTI_LIB -l:libcupti.so.13
// Use: CUDA_INJECTION64_PATH=$PWD/carry/libkernel_trace.so MOESERVE_KERNEL_TRACE=/tmp/k.csv \
//        moeserve bench-step ...; python3 scripts/gpu/timeline.py /tmp/k.csv --device 0
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = 8 << 20;
std::FILE* g_out = nullptr;
std::mutex g_mutex;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string readable(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  const std::string anonymous = "(anonymous namespace)::";
  for (size_t at; (at = name.find(anonymous)) != std::string::npos;) name.erase(at, anonymous.size());
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  const size_t paren = name.find('(');  // drop the argument list
  if (paren != std::string::npos) name.resize(paren);
  for (char& c : name)
    if (c == ',') c = ';';
  return name;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel9*>(record);
    if (g_out) {
      std::fprintf(g_out, "%u,%u,%llu,%llu,%s\n", kernel->deviceId, kernel->streamId,
                   static_cast<unsigned long long>(kernel->start), static_cast<unsigned long long>(kernel->end),
                   readable(kernel->name).c_str());
    }
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("MOESERVE_KERNEL_TRACE");
  g_out = std::fopen(path ? path : "kernel_trace.csv", "w");
  if (!g_out) return 0;
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  std::atexit(flush_at_exit);
  return 1;
}
