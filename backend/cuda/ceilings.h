// Hardware ceilings measured on the device itself, in the same run as a benchmark, so that
// achieved numbers are reported as a fraction of what this GPU can do.
#pragma once

namespace moeserve::cuda {

struct Ceilings {
  double copy_gbs = 0;     // device-to-device copy, bytes read + written per second / 1e9
  double bf16_tflops = 0;  // large bf16 GEMM (cuBLAS, fp32 accumulate) on random data
};

// Takes a few hundred milliseconds; uses about 4.5 GB of device memory while it runs.
Ceilings measure_ceilings(int device);

}  // namespace moeserve::cuda
