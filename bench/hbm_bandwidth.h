// The nominal memory bandwidth of a CUDA device: the data-sheet figure that a "paper bound"
// divides a step's bytes by (no kernel reaches it; a device-to-device copy comes closest).
//
// From the driver: peak memory clock x 2 (double data rate) x bus width, the formula of CUDA's
// bandwidthTest sample (an H100 SXM: 2.619 GHz x 2 x 5120 bits / 8 = 3.35 TB/s). CUDA 13 took
// memoryClockRate out of cudaDeviceProp but kept cudaDevAttrMemoryClockRate, read here. Where
// the driver reports no clock (and under the CUDA emulation, which declares no such attribute)
// the figure comes from a table by device name: H200 4.8 TB/s, H100 PCIe 2.0 TB/s, H100 SXM
// 3.35 TB/s.
#ifndef LLM_BENCH_HBM_BANDWIDTH_H_
#define LLM_BENCH_HBM_BANDWIDTH_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

namespace llm {

struct NominalBandwidth {
  double bytes_per_s = 0;  // 0: unknown
  std::string source;      // how it was found, for the report
};

// By name: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H200", ...
inline NominalBandwidth NominalBandwidthByName(const std::string& name) {
  const auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("H200")) return {4.8e12, "table: H200"};
  if (has("H100") && has("PCIe")) return {2.0e12, "table: H100 PCIe"};
  if (has("H100")) return {3.35e12, "table: H100 SXM"};
  return {0, "unknown device: " + name};
}

inline NominalBandwidth NominalHbmBandwidth(int device, const std::string& name) {
#ifndef LLM_CUDA_EMU
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess &&
      clock_khz > 0 && bus_bits > 0) {
    char source[96];
    std::snprintf(source, sizeof(source), "driver: memory clock %d MHz x 2 x %d bits",
                  clock_khz / 1000, bus_bits);
    return {2.0 * clock_khz * 1e3 * bus_bits / 8.0, source};
  }
  cudaGetLastError();  // the failed query is not the caller's error
#else
  (void)device;
#endif
  return NominalBandwidthByName(name);
}

}  // namespace llm

#endif  // LLM_BENCH_HBM_BANDWIDTH_H_
