"""tests/data/e4m3_rounding.txt is torch's float32 -> float8_e4m3fn rounding with saturation
(clamp to +-448, then cast: what CUDA's cvt.rn.satfinite.e4m3 does), for every e4m3 value,
every midpoint between neighbours and the floats just either side of it, the saturating range,
the subnormal range, signed zeros, infinities, NaN and 4000 log-uniform random floats. The C++
encoder (core/dtype.h f32_to_f8_e4m3) is checked against the file by tests/core/dtype_test.cc;
this test checks the file against torch. `python3 tests/python/test_e4m3_rounding_table.py
--write` regenerates it."""
import pathlib
import sys

import numpy as np
import torch

TABLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "e4m3_rounding.txt"


def inputs() -> np.ndarray:
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn)
    values = np.unique(codes.to(torch.float32).numpy())  # 0 .. 448, increasing
    mids = (values[:-1] + values[1:]) / 2  # exact in fp32
    around = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    edges = np.array([448, 449, 463.9, 464, 464.1, 479.9, 480, 481, 500, 1e4, 3.4e38, np.inf, 2.0**-10, 2.0**-11,
                      2.0**-12, 1e-30, 1.4e-45, 0.0], dtype=np.float32)
    rng = np.random.default_rng(27)
    random = (np.exp(rng.uniform(np.log(2.0**-12), np.log(600.0), 4000))).astype(np.float32)
    positive = np.concatenate([values, around.astype(np.float32), edges, random]).astype(np.float32)
    return np.concatenate([positive, -positive, np.array([np.nan], dtype=np.float32)])


def table_text() -> str:
    x = torch.from_numpy(inputs())
    codes = x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    bits = x.numpy().view(np.uint32)
    return "".join(f"{b:08x} {c:02x}\n" for b, c in zip(bits, codes))


def test_table_is_torch_rounding():
    assert TABLE.read_text() == table_text(), f"{TABLE} differs from torch's rounding (regenerate with --write)"


if __name__ == "__main__" and "--write" in sys.argv:
    TABLE.write_text(table_text())
