/* mreg's one native kernel: Q8_0 encoding, byte-identical to llama.cpp's reference quantizer, vectorized.
 *
 * llama.cpp's quantize_row_q8_0_ref (what llama-quantize writes) rounds each value with libm's roundf, a call
 * per value that the compiler cannot vectorize: 3.5 ns a value here, a third of a 7 B Q8_0 conversion's CPU.
 * This computes the same bytes with three exact rewrites, each checked in tests/test_converters/gguf/test_quants.py:
 *
 *   - the block's largest |x| is the largest of the values' bit patterns with the sign cleared (for finite
 *     floats the two orders agree), an integer maximum the compiler vectorizes;
 *   - roundf(v) for |v| < 2**23 is trunc(v + copysign(0.49999997f, v)) (checked for every float in [0, 130]:
 *     the largest float below one half never carries a value across an integer, and a half does);
 *   - the scale's half precision is rounded to nearest even, as ggml's conversion does.
 *
 * Only finite blocks with a normal (or zero) scale are encoded here. A block holding NaN or Inf, or one whose
 * scale is subnormal (where 1/d can overflow and llama.cpp's float-to-int conversion is undefined), stops the
 * call: it returns that block's index and the caller encodes the rows with llama.cpp's own code instead.
 *
 * Built as an optional extension (pyproject.toml): where no C compiler is present, mreg falls back to
 * llama.cpp's encoder. Loaded with ctypes, which releases the GIL for the call. Compiled with -ffp-contract=off:
 * a fused multiply-add would round v + c differently.
 */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK 32
#define BLOCK_BYTES 34

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MREG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef MREG_CLONES
#define MREG_CLONES
#endif

/* IEEE half bits of a float, round to nearest even; NaN becomes a quiet NaN of the same sign. */
static uint16_t half_bits(float f) {
    uint32_t w;
    memcpy(&w, &f, sizeof w);
    const uint16_t sign = (uint16_t)((w >> 16) & 0x8000u);
    const uint32_t a = w & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (a >= 0x477ff000u) { /* 65520 and up (Inf included) round past the largest half, 65504 */
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) { /* below 2**-14: a multiple of 2**-24, rounded to nearest even by the FPU */
        float scaled;
        memcpy(&scaled, &a, sizeof scaled);
        scaled *= 16777216.0f;                             /* exact: a power of two */
        const float units = (scaled + 8388608.0f) - 8388608.0f; /* nearest even integer, < 2**10 + 1 */
        return sign | (uint16_t)units;
    }
    /* Normal: drop 13 mantissa bits rounding to nearest even, then rebias the exponent (127 -> 15). */
    const uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((rounded - (112u << 23)) >> 13);
}

/* Encode `nblocks` blocks of 32 floats from `x` into `y` (34 bytes each). Returns -1 when every block was
 * encoded, else the index of the first block left to llama.cpp's encoder (blocks before it are written). */
MREG_CLONES
int64_t mreg_quantize_q8_0(const float *x, uint8_t *y, int64_t nblocks) {
    const float half_down = 0.49999997f; /* the largest float below 0.5 */
    for (int64_t i = 0; i < nblocks; i++) {
        const float *xb = x + i * QK;
        uint32_t bits[QK];
        memcpy(bits, xb, sizeof bits);
        uint32_t m = 0;
        for (int j = 0; j < QK; j++) {
            const uint32_t u = bits[j] & 0x7fffffffu;
            m = u > m ? u : m;
        }
        if (m >= 0x7f800000u) {
            return i;
        }
        float amax;
        memcpy(&amax, &m, sizeof amax);
        const float d = amax / 127.0f;
        float id = 0.0f;
        if (m != 0) {
            if (d < FLT_MIN) {
                return i;
            }
            id = 1.0f / d;
        }
        uint8_t *yb = y + i * BLOCK_BYTES;
        const uint16_t h = half_bits(d);
        yb[0] = (uint8_t)(h & 0xffu);
        yb[1] = (uint8_t)(h >> 8);
        int8_t q[QK];
        for (int j = 0; j < QK; j++) {
            const float v = xb[j] * id;
            q[j] = (int8_t)(int32_t)(v + copysignf(half_down, v));
        }
        memcpy(yb + 2, q, sizeof q);
    }
    return -1;
}

/* The scale's conversion over an array, for the tests (checked against numpy's over every float). */
void mreg_half_bits(const float *x, uint16_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        out[i] = half_bits(x[i]);
    }
}
