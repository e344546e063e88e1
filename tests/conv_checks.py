"""What the convolution benchmarks' tests share: a float64 convolution, and the bounds of a bf16
convolution against it and of fp32 channel sums of its stored output."""

import numpy as np

U32 = 2.0**-24  # fp32 unit roundoff
B16 = 2.0**-8  # bf16 unit roundoff: 8 bits of significand


def conv64(x: np.ndarray, w: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The models' convolution in float64 (NHWC input, kernel (out, h, w, in), k//2 padding on
    each side), and the sum of |terms| of each output."""
    k = w.shape[1]
    pad = np.pad(x, ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
    out = (x.shape[1] + 2 * (k // 2) - k) // stride + 1
    span = stride * (out - 1) + 1
    patches = np.stack([pad[:, i:i + span:stride, j:j + span:stride]
                        for i in range(k) for j in range(k)], 3)
    kernel = w.transpose(1, 2, 3, 0).reshape(k * k, w.shape[3], w.shape[0])
    return (np.einsum("nhwkc,kcd->nhwd", patches, kernel),
            np.einsum("nhwkc,kcd->nhwd", np.abs(patches), np.abs(kernel)))


def assert_bf16_conv(y, want: np.ndarray, terms: np.ndarray, taps: int) -> None:
    """y (bf16) is `want` (float64) up to `taps` products summed in fp32 (at most taps - 1
    roundings of sum |terms|), then rounded to bf16."""
    sums = (taps - 1) * U32 * terms
    bound = sums + B16 * (np.abs(want) + sums)
    assert np.all(np.abs(np.asarray(y, np.float64) - want) <= bound)


def assert_channel_sums(y, total, squares) -> None:
    """total and squares are the per-channel fp32 sums of y and y^2 as stored: n - 1 fp32
    roundings of partial sums, plus, where a compile sums the fp32 values before their bf16
    rounding (XLA's CPU compile does), a bf16 rounding of each term (twice that for squares)."""
    y64 = np.asarray(y, np.float64).reshape(-1, y.shape[-1])
    n = y64.shape[0]
    size = np.abs(y64).sum(0)
    assert np.all(np.abs(np.asarray(total) - y64.sum(0)) <= ((n - 1) * U32 + 1.01 * B16) * size)
    power = (y64**2).sum(0)
    assert np.all(np.abs(np.asarray(squares) - power) <= (n * U32 + 2.01 * B16) * power)
