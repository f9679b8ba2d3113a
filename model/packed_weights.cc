#include "model/packed_weights.h"

#include <cstring>
#include <limits>

#include "core/error.h"

namespace moeserve {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A range [begin, end) of [0, total) that starts on a multiple of `unit` and ends on one or at
// `total`.
bool on_boundaries(parallel::Range r, int64_t unit, int64_t total) {
  return r.begin % unit == 0 && (r.end % unit == 0 || r.end == total);
}

// The tensor `name` of `checkpoint`, checked to be `dtype` (one of `dtypes`) and `shape`.
const TensorInfo& checked(const Checkpoint& checkpoint, const std::string& name, std::initializer_list<DType> dtypes,
                          const Shape& shape, const char* what) {
  MS_CHECK(checkpoint.has(name), "{}: missing tensor '{}' ({})", checkpoint.directory(), name, what);
  const TensorInfo& ti = checkpoint.info(name);
  bool dtype_ok = false;
  std::string expected;
  for (DType d : dtypes) {
    dtype_ok = dtype_ok || ti.dtype == d;
    expected += (expected.empty() ? "" : " or ") + std::string(dtype_name(d));
  }
  MS_CHECK(dtype_ok, "{}: tensor '{}' has dtype {}, expected {} ({})", checkpoint.file_of(name), name,
           dtype_name(ti.dtype), expected, what);
  MS_CHECK(ti.shape == shape, "{}: tensor '{}' has shape {}, expected {} ({})", checkpoint.file_of(name), name,
           shape_str(ti.shape), shape_str(shape), what);
  return ti;
}

// Rows [rows) and byte columns [col_bytes) of a row-major [*, row_bytes] tensor, appended to out.
void copy_rows(const std::byte* base, int64_t row_bytes, parallel::Range rows, parallel::Range col_bytes,
               std::vector<std::byte>& out) {
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(rows.size() * col_bytes.size()));
  for (int64_t r = rows.begin; r < rows.end; ++r)
    std::memcpy(out.data() + at + (r - rows.begin) * col_bytes.size(), base + r * row_bytes + col_bytes.begin,
                static_cast<size_t>(col_bytes.size()));
}

// <m>.weight_shape: two integers equal to [n, k].
void check_weight_shape(const Checkpoint& ckpt, const std::string& module, int64_t n, int64_t k) {
  const std::string name = module + ".weight_shape";
  const TensorInfo& ti = checked(ckpt, name, {DType::I64, DType::I32}, {2}, "int4 pack-quantized: [N, K]");
  int64_t dims[2];
  for (int i = 0; i < 2; ++i) {
    if (ti.dtype == DType::I64) {
      std::memcpy(&dims[i], ckpt.data(name) + 8 * i, 8);
    } else {
      int32_t d;
      std::memcpy(&d, ckpt.data(name) + 4 * i, 4);
      dims[i] = d;
    }
  }
  MS_CHECK(dims[0] == n && dims[1] == k, "{}: tensor '{}' is [{}, {}], expected [{}, {}] (the config's shape)",
           ckpt.file_of(name), name, dims[0], dims[1], n, k);
}

PackedWeight read_int4(const Checkpoint& ckpt, const PackedSlice& s) {
  const int64_t group = s.layout.group_size;
  const std::string values = s.module + ".weight_packed", scales = s.module + ".weight_scale";
  if (!ckpt.has(values) && ckpt.has(s.module + ".weight"))
    fail(
        "{}: tensor '{}' is missing: quantization_config quantizes '{}' (int4 pack-quantized), but the checkpoint "
        "stores '{}.weight' ({}); add it to the ignore list",
        ckpt.directory(), values, s.module, s.module, dtype_name(ckpt.info(s.module + ".weight").dtype));
  checked(ckpt, values, {DType::I32}, {s.n, s.k / 8}, "int4 pack-quantized: eight values per int32 along K");
  checked(ckpt, scales, {DType::BF16}, {s.n, s.k / group}, "int4 pack-quantized: one scale per group along K");
  check_weight_shape(ckpt, s.module, s.n, s.k);
  PackedWeight w;
  w.rows = s.rows.size();
  w.cols = s.cols.size();
  copy_rows(ckpt.data(values), s.k / 2, s.rows, {s.cols.begin / 2, s.cols.end / 2}, w.values);
  copy_rows(ckpt.data(scales), s.k / group * 2, s.rows, {s.cols.begin / group * 2, s.cols.end / group * 2}, w.scales);
  return w;
}

PackedWeight read_fp8(const Checkpoint& ckpt, const PackedSlice& s) {
  const int64_t bn = s.layout.block_n, bk = s.layout.block_k;
  const std::string values = s.module + ".weight", scales = s.module + ".weight_scale_inv";
  checked(ckpt, values, {DType::F8_E4M3}, {s.n, s.k}, "fp8 block-quantized weight");
  checked(ckpt, scales, {DType::F32}, {ceil_div(s.n, bn), ceil_div(s.k, bk)},
          "fp8 block scales: [ceil(N / block_n), ceil(K / block_k)]");
  PackedWeight w;
  w.rows = s.rows.size();
  w.cols = s.cols.size();
  copy_rows(ckpt.data(values), s.k, s.rows, s.cols, w.values);
  const parallel::Range block_rows{s.rows.begin / bn, ceil_div(s.rows.end, bn)};
  const parallel::Range block_cols{s.cols.begin / bk, ceil_div(s.cols.end, bk)};
  copy_rows(ckpt.data(scales), ceil_div(s.k, bk) * 4, block_rows, {block_cols.begin * 4, block_cols.end * 4}, w.scales);
  return w;
}

}  // namespace

void check_packed_slice(const PackedSlice& s, int rank) {
  if (s.layout.quant == ops::WeightQuant::int4_group) {
    const std::string name = s.module + ".weight_packed";
    MS_CHECK(s.k % s.layout.group_size == 0, "tensor '{}': K = {} is not a multiple of the group size {}", name, s.k,
             s.layout.group_size);
    MS_CHECK(on_boundaries(s.cols, s.layout.group_size, s.k),
             "tensor '{}': rank {} holds columns [{}, {}) of K = {}, which cuts a group of {}; use a plan that splits "
             "this weight on group boundaries",
             name, rank, s.cols.begin, s.cols.end, s.k, s.layout.group_size);
    return;
  }
  const std::string name = s.module + ".weight";
  MS_CHECK(on_boundaries(s.rows, s.layout.block_n, s.n) && on_boundaries(s.cols, s.layout.block_k, s.k),
           "tensor '{}': rank {} holds rows [{}, {}) and columns [{}, {}) of [{}, {}], which cut a {}x{} scale "
           "block; use a plan that splits this weight on block boundaries",
           name, rank, s.rows.begin, s.rows.end, s.cols.begin, s.cols.end, s.n, s.k, s.layout.block_n,
           s.layout.block_k);
}

PackedWeight read_packed(const Checkpoint& checkpoint, const PackedSlice& s) {
  MS_CHECK(s.layout.quantized(), "tensor '{}': read_packed of a weight that is not quantized", s.module);
  return s.layout.quant == ops::WeightQuant::int4_group ? read_int4(checkpoint, s) : read_fp8(checkpoint, s);
}

Tensor dequantize(const PackedWeight& w, const ops::QuantLayout& l) {
  Tensor out(DType::F32, {w.rows, w.cols});
  float* dst = out.f32();
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) {
      float value, scale;
      if (l.quant == ops::WeightQuant::int4_group) {
        uint32_t word;
        std::memcpy(&word, w.values.data() + (r * (w.cols / 8) + c / 8) * 4, 4);
        value = static_cast<float>(static_cast<int>((word >> (4 * (c % 8))) & 0xf) - 8);
        uint16_t s;
        std::memcpy(&s, w.scales.data() + (r * (w.cols / l.group_size) + c / l.group_size) * 2, 2);
        scale = bf16_to_f32(s);
      } else {
        value = f8_e4m3_to_f32(static_cast<uint8_t>(w.values[r * w.cols + c]));
        std::memcpy(&scale, w.scales.data() + ((r / l.block_n) * ceil_div(w.cols, l.block_k) + c / l.block_k) * 4, 4);
      }
      dst[r * w.cols + c] = value * scale;
    }
  return out;
}

}  // namespace moeserve
