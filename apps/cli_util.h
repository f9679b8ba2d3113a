// Small helpers shared by subcommands: id lists and .npy output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moeserve::apps {

// "1,2,3" -> {1, 2, 3}; `what` names the option in errors.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what);
std::string join_ids(const std::vector<int32_t>& ids);
// Writes an fp32 tensor as a NumPy .npy file.
void write_npy(const std::string& path, const Tensor& tensor);
// "1.0 T", "32.9 B", "15.2 M"
std::string human_count(double count);
std::string human_bytes(double bytes);

}  // namespace moeserve::apps
