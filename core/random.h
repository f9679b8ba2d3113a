// Counter-based random numbers: value i of stream `seed` is a pure function of (seed, i),
// so synthetic weights and seeded sampling are reproducible and any slice can be generated
// without generating what precedes it.
#pragma once

#include <cstdint>
#include <string_view>

#ifdef __CUDACC__
#define MS_HOST_DEVICE __host__ __device__
#else
#define MS_HOST_DEVICE
#endif

namespace moeserve {

MS_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a, for deriving a stream seed from a tensor name.
inline uint64_t hash_string(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// 32 random bits.
MS_HOST_DEVICE inline uint32_t random_word(uint64_t seed, uint64_t index) {
  return static_cast<uint32_t>(splitmix64(seed ^ splitmix64(index)) >> 32);
}

// Uniform in [0, 1) with 24 bits of resolution.
MS_HOST_DEVICE inline float uniform01(uint64_t seed, uint64_t index) {
  return static_cast<float>(splitmix64(seed ^ splitmix64(index)) >> 40) * (1.0f / 16777216.0f);
}

// Uniform in [-1, 1).
MS_HOST_DEVICE inline float uniform_pm1(uint64_t seed, uint64_t index) { return 2.0f * uniform01(seed, index) - 1.0f; }

}  // namespace moeserve
