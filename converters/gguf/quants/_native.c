/* mreg's native kernels: Q8_0, Q6_K, Q5_K, Q4_K, Q3_K and Q2_K encoding (the five K-quants with an importance
 * matrix too), byte-identical to llama.cpp's quantizers, vectorized. Q8_0 first; the K-quants after it, with their own
 * comment.
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
 * a fused multiply-add would round v + c differently; and with -fno-math-errno, so that sqrtf is the instruction
 * (the same correctly rounded result) rather than a call out of a vectorized clone (see INLINE below).
 */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK 32
#define BLOCK_BYTES 34

/* MREG_ONE_TARGET ("avx2", "default", ...): the entry points for that target alone, no clones, no resolver (the
 * tests build each clone's code so, to compare its bytes on a CPU whose resolver picks another). */
#if defined(MREG_ONE_TARGET)
#define MREG_CLONES __attribute__((target(MREG_ONE_TARGET)))
#elif defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MREG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef MREG_CLONES
#define MREG_CLONES
#endif
/* Everything a clone runs is inlined into it: GCC 12 left out the vzeroupper on return paths that went through a
 * call into default-target code, and the dirty upper halves then made llama.cpp's SSE encoders in the same thread
 * two to five times slower (measured: ggml's Q4_K, 65 -> 320 ms per million weights, until the next vzeroupper). */
#define INLINE static inline __attribute__((always_inline))

/* IEEE half bits of a float, round to nearest even; NaN becomes a quiet NaN of the same sign. */
INLINE uint16_t half_bits(float f) {
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

/* The float a half's bits stand for (exact: every half is a float). */
INLINE float half_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604645e-8f; /* m * 2**-24: exact */
        return sign ? -f : f;
    }
    const uint32_t bits = sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
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

/* The width of the vectors the kernels' clones use on this CPU, as their resolvers choose: 64 bytes (avx512f), 32
 * (avx2) or 16 (the default clone, and other architectures). With 16, the K-quants' 64-byte lanes become four
 * registers each and spill: measured slower than llama.cpp's scalar encoders (Q6_K 69 against 28 ms per million
 * weights), so mreg leaves the K-quants to llama.cpp there. */
int mreg_vector_bytes(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 64 : __builtin_cpu_supports("avx2") ? 32 : 16;
#else
    return 16; /* one build for the architecture's baseline: no clones */
#endif
}

/* ---- K-quants: Q6_K, Q5_K, Q4_K, Q3_K and Q2_K ---------------------------------------------------------------
 *
 * llama.cpp's quantize_row_q6_K_ref, q5_K, q4_K, q3_K and q2_K (and with an importance matrix the quantize_row_*_impl)
 * search a scale per sub-block (make_qx_quants, make_qkx2_quants, make_qkx3_quants): for each of 16 to 38 trial
 * scales, a pass over the sub-block's values with sums accumulated in order. The sums cannot be reordered, but the
 * sub-blocks are independent: here each of 16 vector lanes runs one sub-block's search (Q6_K, Q2_K: the 16
 * sub-blocks of one super-block, and Q3_K; Q4_K, Q5_K: the 8 of two), every lane doing the reference's float operations in
 * the reference's order. IEEE arithmetic rounds a lane as it rounds a scalar, so each lane's results are the
 * reference's bits. Where the reference branches per sub-block (a better trial scale, an all-zero group), the
 * lanes compute both sides and select, with the same comparisons. (Q3_K's make_q3_quants moves one quant at a time:
 * see its own comment.)
 *
 * Intermediate Inf and NaN (a degenerate trial of the search) reach only comparisons, which are false either way,
 * and ggml's nearest_int of a NaN (whose mantissa is the default NaN's, inputs and weights being finite: the caller
 * hands weights holding NaN or Inf to llama.cpp) is 0 for both. The per-super-block steps (the scales' 6- or 8-bit
 * quantization, make_qp_quants) are scalar code in the reference's order and types. A
 * super-block holding NaN or Inf, or one whose super-block scale overflows half precision (llama.cpp writes a
 * block that decodes to Inf or NaN), is handed back: the call returns its index, blocks before it written.
 */

/* Generic vectors: each clone of the entry points lowers them to its own registers (one zmm, two ymm, four xmm);
 * the helpers taking them are always inlined into a clone, so no vector crosses a call (hence no -Wpsabi). */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
#define LANES 16
#define QK_K 256
#define Q6_K_BYTES 210
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q2_K_BYTES 84
#define GROUP_MAX_EPS 1e-15f
/* ggml's nearest_int: add 1.5 * 2**23 and read the mantissa (ties to even; a wrapped value past 2**22). */
INLINE int nearest_int(float f) {
    const float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

INLINE vi v_nearest(vf v) {
    const vf t = v + 12582912.0f;
    return (((vi)t) & 0x007fffff) - 0x00400000;
}

INLINE vi v_splat_i(int32_t c) {
    vi v;
    for (int s = 0; s < LANES; s++) {
        v[s] = c;
    }
    return v;
}

INLINE vf v_splat(float c) {
    vf v;
    for (int s = 0; s < LANES; s++) {
        v[s] = c;
    }
    return v;
}

/* Comparisons, each a mask (-1 or 0 a lane). GCC 12 lowers a comparison of 64-byte vectors to a compare per lane
 * where the target has no 64-byte vectors (the avx2 and default clones: the K-quant kernels ran there slower than
 * llama.cpp's scalar code), and in the avx512f clone where comparisons are combined with `&`; it lowers
 * comparisons of 32-byte halves, and selects of them, to vector instructions on every target. */
typedef float vf_half __attribute__((vector_size(32)));
typedef int32_t vi_half __attribute__((vector_size(32)));
#define V_COMPARE(name, type, half, op)                                                                              \
    INLINE vi name(type a, type b) {                                                                                 \
        half a2[2], b2[2];                                                                                           \
        vi_half r2[2];                                                                                               \
        memcpy(a2, &a, sizeof a2);                                                                                   \
        memcpy(b2, &b, sizeof b2);                                                                                   \
        r2[0] = a2[0] op b2[0];                                                                                      \
        r2[1] = a2[1] op b2[1];                                                                                      \
        vi r;                                                                                                        \
        memcpy(&r, r2, sizeof r);                                                                                    \
        return r;                                                                                                    \
    }
V_COMPARE(v_gt, vf, vf_half, >)
V_COMPARE(v_lt, vf, vf_half, <)
V_COMPARE(v_eq, vf, vf_half, ==)
V_COMPARE(v_ne, vf, vf_half, !=)
V_COMPARE(v_lti, vi, vi_half, <)
V_COMPARE(v_gti, vi, vi_half, >)
V_COMPARE(v_nei, vi, vi_half, !=)
V_COMPARE(v_gei, vi, vi_half, >=)

INLINE vf v_sel(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }

INLINE vi v_seli(vi mask, vi a, vi b) { return (mask & a) | (~mask & b); }

INLINE vi v_clamp(vi l, int32_t lo, int32_t hi) {
    l = v_seli(v_lti(l, v_splat_i(lo)), v_splat_i(lo), l);
    return v_seli(v_gti(l, v_splat_i(hi)), v_splat_i(hi), l);
}

INLINE vf v_float(vi l) { return __builtin_convertvector(l, vf); }

INLINE vf v_abs(vf v) { return (vf)((vi)v & 0x7fffffff); }

/* Each lane's correctly rounded square root (sqrtf is the instruction: -fno-math-errno). */
INLINE vf v_sqrt(vf t) {
    vf root;
    for (int s = 0; s < LANES; s++) {
        root[s] = sqrtf(t[s]);
    }
    return root;
}

/* The sum of a super-block's squares, in order (the reference's sigma2 starts from it). */
INLINE float sum_squares(const float *x) {
    float sum = 0;
    for (int j = 0; j < QK_K; ++j) {
        sum += x[j] * x[j];
    }
    return sum;
}

/* Lane s of out[i] = x[n * s + i]: sub-block s's element i, for n elements a sub-block. */
INLINE void to_lanes(const float *x, int n, vf *out) {
    float t[LANES];
    for (int i = 0; i < n; i++) {
        for (int s = 0; s < LANES; s++) {
            t[s] = x[n * s + i];
        }
        memcpy(&out[i], t, sizeof t);
    }
}

/* The same over two super-blocks of 8 sub-blocks of 32, `a` in lanes 0-7 and `b` in lanes 8-15. */
INLINE void pair_to_lanes(const float *a, const float *b, vf *out) {
    float t[LANES];
    for (int i = 0; i < 32; i++) {
        for (int s = 0; s < 8; s++) {
            t[s] = a[32 * s + i];
            t[s + 8] = b[32 * s + i];
        }
        memcpy(&out[i], t, sizeof t);
    }
}

/* The largest |x| of n floats as bits (Inf and NaN above 0x7f7fffff). */
INLINE uint32_t abs_max_bits(const float *x, int n) {
    uint32_t m = 0;
    for (int j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, &x[j], sizeof u);
        u &= 0x7fffffffu;
        m = u > m ? u : m;
    }
    return m;
}

/* make_qx_quants(16, nmax, x, L, rmse_type 1, qw) in each lane (Q6_K: nmax 32; Q3_K with importance weights: 4),
 * with w the importance weights qw or, without them (w NULL), x * x: returns the scale, L the quants + nmax. */
INLINE vf qx_search(const vf *x, const vf *qw, vi *L, int nmax) {
    vf amax = {0}, max = {0};
    vf w[16], wx[16];
    for (int i = 0; i < 16; i++) {
        const vf ax = v_abs(x[i]);
        const vi bigger = v_gt(ax, amax);
        amax = v_sel(bigger, ax, amax);
        max = v_sel(bigger, x[i], max);
        w[i] = qw ? qw[i] : x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    vf iscale = v_splat((float)-nmax) / max, sumlx = {0}, suml2 = {0};
    for (int i = 0; i < 16; i++) {
        const vf l = v_float(v_clamp(v_nearest(iscale * x[i]), -nmax, nmax - 1));
        sumlx = sumlx + wx[i] * l;
        suml2 = suml2 + w[i] * l * l;
    }
    const vf zero = {0};
    vf scale = v_sel(v_ne(suml2, zero), sumlx / suml2, zero);
    vf best = scale * sumlx, best_iscale = iscale;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) {
            continue;
        }
        iscale = v_splat(-((float)nmax + 0.1f * (float)is)) / max;
        vf slx = {0}, sl2 = {0};
        for (int i = 0; i < 16; i++) {
            const vf l = v_float(v_clamp(v_nearest(iscale * x[i]), -nmax, nmax - 1));
            slx = slx + wx[i] * l;
            sl2 = sl2 + w[i] * l * l;
        }
        const vi better = v_gt(sl2, zero) & v_gt(slx * slx, best * sl2);
        const vf s = slx / sl2;
        scale = v_sel(better, s, scale);
        best = v_sel(better, s * slx, best);
        best_iscale = v_sel(better, iscale, best_iscale);
    }
    const vi empty = v_lt(amax, v_splat(GROUP_MAX_EPS));
    for (int i = 0; i < 16; i++) {
        L[i] = v_seli(empty, v_splat_i(0), v_clamp(v_nearest(best_iscale * x[i]), -nmax, nmax - 1) + nmax);
    }
    return v_sel(empty, zero, scale);
}

/* One Q6_K super-block (quantize_row_q6_K_ref, or quantize_row_q6_K_impl with its 256 importance weights `qw`);
 * 0, or -1 where its scale overflows half precision (nothing written then). */
INLINE int q6_k_block(const float *xb, const float *qw, uint8_t *y) {
    vf x[16], w[16];
    vi L[16];
    to_lanes(xb, 16, x);
    if (qw) {
        to_lanes(qw, 16, w);
    }
    float scales[LANES];
    const vf found = qx_search(x, qw ? w : NULL, L, 32);
    memcpy(scales, &found, sizeof scales);
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ib++) {
        const float abs_scale = fabsf(scales[ib]);
        if (abs_scale > max_abs_scale) {
            max_abs_scale = abs_scale;
            max_scale = scales[ib];
        }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, Q6_K_BYTES);
        return 0;
    }
    const float iscale = -128.0f / max_scale;
    const uint16_t hd = half_bits(1 / iscale);
    if ((hd & 0x7c00u) == 0x7c00u) {
        return -1;
    }
    int8_t sc[16];
    float dsub[LANES];
    const float dh = half_float(hd);
    for (int ib = 0; ib < 16; ib++) {
        const int v = nearest_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(v < 127 ? v : 127);
        dsub[ib] = dh * sc[ib];
    }
    vf d;
    memcpy(&d, dsub, sizeof d);
    const vi nonzero = v_ne(d, v_splat(0.0f));
    for (int i = 0; i < 16; i++) { /* sub-blocks whose scale rounds to 0 keep the search's quants */
        L[i] = v_seli(nonzero, v_clamp(v_nearest(x[i] / d), -32, 31) + 32, L[i]);
    }
    uint8_t q[QK_K];
    for (int i = 0; i < 16; i++) {
        int32_t t[LANES];
        memcpy(t, &L[i], sizeof t);
        for (int s = 0; s < LANES; s++) {
            q[16 * s + i] = (uint8_t)t[s];
        }
    }
    uint8_t *ql = y, *qh = y + 128;
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = q[j + l] & 0xF, q2 = q[j + l + 32] & 0xF;
            const uint8_t q3 = q[j + l + 64] & 0xF, q4 = q[j + l + 96] & 0xF;
            ql[l] = q1 | (q3 << 4);
            ql[l + 32] = q2 | (q4 << 4);
            qh[l] = (q[j + l] >> 4) | ((q[j + l + 32] >> 4) << 2) | ((q[j + l + 64] >> 4) << 4)
                    | ((q[j + l + 96] >> 4) << 6);
        }
        ql += 64;
        qh += 32;
    }
    memcpy(y + 192, sc, sizeof sc);
    y[208] = (uint8_t)(hd & 0xffu);
    y[209] = (uint8_t)(hd >> 8);
    return 0;
}

/* The importance weights of block i of a call whose first block is block `first` of rows of `row_blocks`. */
INLINE const float *block_weights(const float *qw, int64_t row_blocks, int64_t first, int64_t i) {
    return qw ? qw + (first + i) % row_blocks * QK_K : NULL;
}

/* The loop of a K-quant type encoded one super-block at a time (Q6_K, Q2_K), as the body of its entry points: each of
 * `nblocks` super-blocks of 256 floats from `x` by `encode(xb, weights, out)` into `y` (`bytes` each), `qw` as
 * mreg_quantize_q6_k_w's. Returns -1 when every block was encoded, else the index of the first block left to
 * llama.cpp's encoder (NaN or Inf in it, or refused by `encode`; blocks before it are written). A macro, not a
 * function taking `encode`: every call in a clone stays inlined (see the K-quant comment). */
#define EACH_SUPER_BLOCK(encode, bytes, qw, row_blocks, first)                                                       \
    for (int64_t i = 0; i < nblocks; i++) {                                                                          \
        const float *xb = x + i * QK_K;                                                                              \
        if (abs_max_bits(xb, QK_K) >= 0x7f800000u                                                                    \
            || encode(xb, block_weights(qw, row_blocks, first, i), y + i * (bytes)) < 0) {                           \
            return i;                                                                                                \
        }                                                                                                            \
    }                                                                                                                \
    return -1

/* Encode `nblocks` Q6_K super-blocks of 256 floats from `x` into `y` (210 bytes each), as EACH_SUPER_BLOCK says. */
MREG_CLONES
int64_t mreg_quantize_q6_k(const float *x, uint8_t *y, int64_t nblocks) {
    EACH_SUPER_BLOCK(q6_k_block, Q6_K_BYTES, NULL, 1, 0);
}

/* The same with an importance matrix: `qw` one weight per column of rows of `row_blocks` super-blocks, `x` starting
 * at block `first` of a row (llama.cpp's quantize_q6_K with quant_weights). */
MREG_CLONES
int64_t mreg_quantize_q6_k_w(const float *x, uint8_t *y, int64_t nblocks, const float *qw, int64_t row_blocks,
                             int64_t first) {
    EACH_SUPER_BLOCK(q6_k_block, Q6_K_BYTES, qw, row_blocks, first);
}

/* make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad) in each lane (Q4_K: 32, 15,
 * -1, 0.1, 20, false; Q5_K: 32, 31, -0.5, 0.1, 15, false; Q2_K: 16, 3, -0.5, 0.1, 15, true, its error |diff|); with
 * importance weights make_qkx3_quants (-0.9, 0.05, 36), the same search
 * (its `max <= min` is `max == min` here: min is at most the smallest x). Returns the scale and writes -min to
 * *the_min. The search's min moves with its best trial and the next trials start from it. */
INLINE vf kx_search(const vf *x, const vf *w, vi *L, vf *the_min, int n, int nmax, float rmin, float rdelta, int nstep,
                     int use_mad) {
    vf min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        min = v_sel(v_lt(x[i], min), x[i], min);
        max = v_sel(v_gt(x[i], max), x[i], max);
        sum_w = sum_w + w[i];
        sum_x = sum_x + w[i] * x[i];
    }
    const vf zero = {0};
    min = v_sel(v_gt(min, zero), zero, min);
    const vi flat = v_eq(max, min);
    const vf flat_min = min;
    vf iscale = v_splat((float)nmax) / (max - min);
    vf scale = v_splat(1.0f) / iscale, best = {0};
    for (int i = 0; i < n; i++) {
        L[i] = v_clamp(v_nearest(iscale * (x[i] - min)), 0, nmax);
        vf diff = scale * v_float(L[i]) + min - x[i];
        diff = use_mad ? v_abs(diff) : diff * diff;
        best = best + w[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = v_splat(rmin + rdelta * (float)is + (float)nmax) / (max - min);
        vi aux[32];
        vf sum_l = {0}, sum_l2 = {0}, sum_xl = {0};
        for (int i = 0; i < n; i++) {
            aux[i] = v_clamp(v_nearest(iscale * (x[i] - min)), 0, nmax);
            const vf l = v_float(aux[i]);
            sum_l = sum_l + w[i] * l;
            sum_l2 = sum_l2 + w[i] * l * l;
            sum_xl = sum_xl + w[i] * l * x[i];
        }
        const vf D = sum_w * sum_l2 - sum_l * sum_l;
        vf this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        vf this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        const vi positive = v_gt(this_min, zero);
        this_min = v_sel(positive, zero, this_min);
        this_scale = v_sel(positive, sum_xl / sum_l2, this_scale);
        vf cur = {0};
        for (int i = 0; i < n; i++) {
            vf diff = this_scale * v_float(aux[i]) + this_min - x[i];
            diff = use_mad ? v_abs(diff) : diff * diff;
            cur = cur + w[i] * diff;
        }
        const vi better = v_gt(D, zero) & v_lt(cur, best);
        for (int i = 0; i < n; i++) {
            L[i] = v_seli(better, aux[i], L[i]);
        }
        best = v_sel(better, cur, best);
        scale = v_sel(better, this_scale, scale);
        min = v_sel(better, this_min, min);
    }
    for (int i = 0; i < n; i++) {
        L[i] = v_seli(flat, v_splat_i(0), L[i]);
    }
    *the_min = -v_sel(flat, flat_min, min);
    return v_sel(flat, zero, scale);
}

/* The 6-bit scales and mins of Q4_K and Q5_K (and the super-block's d, dmin) into y's header, and each sub-block's
 * scale and min as llama.cpp reads them back (get_scale_min_k4) into d and dm. -1 where d or dmin overflows half
 * precision (nothing written then). Scales past 63 (the weighted search's make_qp_quants can leave them) are
 * packed, and read back, with the bits they lose, as llama.cpp does. */
INLINE int kx_pack_scales(const uint8_t *ls, const uint8_t *lm, float d_block, float m_block, uint8_t *y, float *d,
                          float *dm) {
    const uint16_t hd = half_bits(d_block), hm = half_bits(m_block);
    if ((hd & 0x7c00u) == 0x7c00u || (hm & 0x7c00u) == 0x7c00u) {
        return -1;
    }
    uint8_t *sc = y + 4;
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    y[0] = (uint8_t)(hd & 0xffu);
    y[1] = (uint8_t)(hd >> 8);
    y[2] = (uint8_t)(hm & 0xffu);
    y[3] = (uint8_t)(hm >> 8);
    const float fd = half_float(hd), fm = half_float(hm);
    for (int j = 0; j < 8; j++) {
        const uint8_t s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        const uint8_t m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        d[j] = fd * s;
        dm[j] = fm * m;
    }
    return 0;
}

/* Super-block scales from the 8 sub-blocks' as quantize_row_q4_K_ref (and q5_K) choose them; see kx_pack_scales. */
INLINE int kx_header(const float *scales, const float *mins, uint8_t *y, float *d, float *dm) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale) {
            max_scale = scales[j];
        }
        if (mins[j] > max_min) {
            max_min = mins[j];
        }
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)nearest_int(inv_scale * scales[j]);
        lm[j] = (uint8_t)nearest_int(inv_min * mins[j]);
        ls[j] = ls[j] < 63 ? ls[j] : 63;
        lm[j] = lm[j] < 63 ? lm[j] : 63;
    }
    return kx_pack_scales(ls, lm, max_scale / 63.f, max_min / 63.f, y, d, dm);
}

/* make_qp_quants(n, nmax, x, L, qw): the quants of n sub-block scales (or mins) under the weights qw (the
 * sub-blocks' summed importance; Q4_K, Q5_K: 8, 63; Q2_K: 16, 15), in llama.cpp's types: L is uint8_t (a negative
 * quant wraps) where the sums use the int. Returns the super-block's scale. */
INLINE float make_qp(const float *x, uint8_t *L, const float *qw, int n, int nmax) {
    float max = 0;
    for (int i = 0; i < n; ++i) {
        max = max > x[i] ? max : x[i];
    }
    if (max < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)nearest_int(iscale * x[i]);
    }
    float scale = 1 / iscale, best_mse = 0;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * L[i];
        best_mse += qw[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) {
            continue;
        }
        const float iscale_is = (0.1f * is + nmax) / max, scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale_is * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_is * l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        sumlx += qw[i] * x[i] * l;
        suml2 += qw[i] * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = qw[i];
            float slx = sumlx - w * x[i] * L[i];
            float sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = new_l < nmax ? new_l : nmax;
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) {
            break;
        }
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Super-block scales as quantize_row_q4_K_impl (and q5_K) choose them with importance weights (`sw`: each
 * sub-block's summed weights); see kx_pack_scales. */
INLINE int kx_header_weighted(const float *scales, const float *mins, const float *sw, uint8_t *y, float *d,
                              float *dm) {
    uint8_t ls[8], lm[8];
    const float d_block = make_qp(scales, ls, sw, 8, 63);
    const float m_block = make_qp(mins, lm, sw, 8, 63);
    return kx_pack_scales(ls, lm, d_block, m_block, y, d, dm);
}

/* The quants of one Q4_K super-block (nmax 15: 4 bits each) or Q5_K (31: the fifth bit in qh) after the header. */
INLINE void kx_pack(const uint8_t *q, uint8_t *y, int nmax) {
    uint8_t *qs = y + (nmax == 15 ? 16 : 48), *qh = y + 16;
    if (nmax == 31) {
        memset(qh, 0, 32);
    }
    for (int n = 0; n < QK_K; n += 64) {
        const uint8_t m1 = (uint8_t)(1u << (n / 32)), m2 = (uint8_t)(2u << (n / 32));
        for (int j = 0; j < 32; j++) {
            uint8_t l1 = q[n + j], l2 = q[n + j + 32];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= m1;
            }
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= m2;
            }
            qs[j] = l1 | (l2 << 4);
        }
        qs += 32;
    }
}

/* Each sub-block's weights as quantize_row_q4_K_ref (and q5_K) make them: the root mean square of the sub-block
 * plus |x|. */
INLINE void kx_weights(const vf *x, vf *w) {
    vf sum_x2 = {0};
    for (int i = 0; i < 32; i++) {
        sum_x2 = sum_x2 + x[i] * x[i];
    }
    float sums[LANES], av[LANES];
    memcpy(sums, &sum_x2, sizeof sums);
    for (int s = 0; s < LANES; s++) {
        av[s] = sqrtf(sums[s] / 32);
    }
    vf av_x;
    memcpy(&av_x, av, sizeof av_x);
    for (int i = 0; i < 32; i++) {
        w[i] = av_x + v_abs(x[i]);
    }
}

/* With importance weights qw (lanes as x), as quantize_row_q4_K_impl makes them: qw * sqrt(sigma2 + x * x), sigma2
 * twice the mean square of the whole super-block (a and b, the pair's two). `sw`: each sub-block's summed weights. */
INLINE void kx_weights_imatrix(const float *a, const float *b, const vf *x, const vf *qw, vf *w, float *sw) {
    float sigma2[2];
    const float *blocks[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        sigma2[k] = 2 * sum_squares(blocks[k]) / QK_K;
    }
    vf sig, sum = {0};
    for (int s = 0; s < LANES; s++) {
        sig[s] = sigma2[s / 8];
    }
    for (int i = 0; i < 32; i++) {
        w[i] = qw[i] * v_sqrt(sig + x[i] * x[i]);
        sum = sum + w[i];
    }
    memcpy(sw, &sum, LANES * sizeof(float));
}

/* Two Q4_K or Q5_K super-blocks (a, b: the second may repeat the first), 8 lanes each, with their importance
 * weights (qa, qb) or none (NULL). Returns a bit per super-block whose scales overflow half precision (nothing
 * written for it). */
INLINE int kx_pair(const float *a, const float *b, const float *qa, const float *qb, uint8_t *y0, uint8_t *y1,
                   int nmax, float rmin, int nstep) {
    vf x[32], w[32];
    vi L[32];
    float sw[LANES];
    pair_to_lanes(a, b, x);
    if (qa) {
        vf qw[32];
        pair_to_lanes(qa, qb, qw);
        kx_weights_imatrix(a, b, x, qw, w, sw);
    } else {
        kx_weights(x, w);
    }
    vf the_min;
    const vf found = qa ? kx_search(x, w, L, &the_min, 32, nmax, -0.9f, 0.05f, 36, 0)
                        : kx_search(x, w, L, &the_min, 32, nmax, rmin, 0.1f, nstep, 0);
    float scales[LANES], mins[LANES], d[LANES], dm[LANES];
    memcpy(scales, &found, sizeof scales);
    memcpy(mins, &the_min, sizeof mins);
    int overflow = 0;
    uint8_t *ys[2] = {y0, y1};
    for (int k = 0; k < 2; k++) {
        const int fits = qa ? kx_header_weighted(scales + 8 * k, mins + 8 * k, sw + 8 * k, ys[k], d + 8 * k, dm + 8 * k)
                            : kx_header(scales + 8 * k, mins + 8 * k, ys[k], d + 8 * k, dm + 8 * k);
        if (fits < 0) {
            overflow |= 1 << k;
            memset(d + 8 * k, 0, 8 * sizeof(float)); /* its lanes are computed, not written */
            memset(dm + 8 * k, 0, 8 * sizeof(float));
        }
    }
    vf dv, dmv;
    memcpy(&dv, d, sizeof dv);
    memcpy(&dmv, dm, sizeof dmv);
    const vi nonzero = v_ne(dv, v_splat(0.0f));
    for (int i = 0; i < 32; i++) { /* sub-blocks whose scale rounds to 0 keep the search's quants */
        L[i] = v_seli(nonzero, v_clamp(v_nearest((x[i] + dmv) / dv), 0, nmax), L[i]);
    }
    uint8_t q[2 * QK_K];
    for (int i = 0; i < 32; i++) {
        int32_t t[LANES];
        memcpy(t, &L[i], sizeof t);
        for (int s = 0; s < LANES; s++) {
            q[32 * s + i] = (uint8_t)t[s];
        }
    }
    for (int k = 0; k < 2; k++) {
        if (!(overflow & (1 << k))) {
            kx_pack(q + QK_K * k, ys[k], nmax);
        }
    }
    return overflow;
}

/* Q4_K or Q5_K over `nblocks` super-blocks, two at a time; `bytes` a block; `qw` as mreg_quantize_q6_k_w's. */
INLINE int64_t kx_quantize(const float *x, uint8_t *y, int64_t nblocks, const float *qw, int64_t row_blocks,
                           int64_t first, int nmax, float rmin, int nstep, int64_t bytes) {
    for (int64_t i = 0; i < nblocks; i += 2) {
        const float *xb = x + i * QK_K;
        if (abs_max_bits(xb, QK_K) >= 0x7f800000u) {
            return i;
        }
        /* the last block, or one before a block to hand back, is paired with itself */
        const int two = i + 1 < nblocks && abs_max_bits(xb + QK_K, QK_K) < 0x7f800000u;
        uint8_t spare[Q5_K_BYTES];
        uint8_t *y0 = y + i * bytes, *y1 = two ? y0 + bytes : spare;
        const float *q0 = block_weights(qw, row_blocks, first, i);
        const float *q1 = two ? block_weights(qw, row_blocks, first, i + 1) : q0;
        const int overflow = kx_pair(xb, two ? xb + QK_K : xb, q0, q1, y0, y1, nmax, rmin, nstep);
        if (overflow & 1) {
            return i;
        }
        if ((!two && i + 1 < nblocks) || (overflow & 2)) {
            return i + 1;
        }
    }
    return -1;
}

/* Encode `nblocks` Q4_K super-blocks of 256 floats from `x` into `y` (144 bytes each). Returns -1 when every block
 * was encoded, else the index of the first block left to llama.cpp's encoder (blocks before it are written). */
MREG_CLONES
int64_t mreg_quantize_q4_k(const float *x, uint8_t *y, int64_t nblocks) {
    return kx_quantize(x, y, nblocks, NULL, 1, 0, 15, -1.0f, 20, Q4_K_BYTES);
}

/* Q5_K likewise (176 bytes a block). */
MREG_CLONES
int64_t mreg_quantize_q5_k(const float *x, uint8_t *y, int64_t nblocks) {
    return kx_quantize(x, y, nblocks, NULL, 1, 0, 31, -0.5f, 15, Q5_K_BYTES);
}

/* Q4_K with an importance matrix, as mreg_quantize_q6_k_w. */
MREG_CLONES
int64_t mreg_quantize_q4_k_w(const float *x, uint8_t *y, int64_t nblocks, const float *qw, int64_t row_blocks,
                             int64_t first) {
    return kx_quantize(x, y, nblocks, qw, row_blocks, first, 15, -1.0f, 20, Q4_K_BYTES);
}

/* Q5_K with an importance matrix, as mreg_quantize_q6_k_w. */
MREG_CLONES
int64_t mreg_quantize_q5_k_w(const float *x, uint8_t *y, int64_t nblocks, const float *qw, int64_t row_blocks,
                             int64_t first) {
    return kx_quantize(x, y, nblocks, qw, row_blocks, first, 31, -0.5f, 15, Q5_K_BYTES);
}

/* The weights of 16 sub-blocks of 16, one a lane, as quantize_row_q2_K_impl and q3_K_impl make them:
 * qw * sqrt(sigma2 + x * x), qw the super-block's 256 importance weights. Returns each sub-block's sum of them. */
INLINE vf sub_block_weights(const vf *x, const float *qwb, float sigma2, vf *w) {
    vf qw[16], sum = {0};
    to_lanes(qwb, 16, qw);
    for (int i = 0; i < 16; i++) {
        w[i] = qw[i] * v_sqrt(v_splat(sigma2) + x[i] * x[i]);
        sum = sum + w[i];
    }
    return sum;
}

/* Q2_K's scales and mins with importance weights qw (quantize_row_q2_K_impl): the sub-blocks' make_qkx3_quants
 * under qw * sqrt(sigma2 + x * x), then make_qp_quants' 4-bit quants of the scales and mins. The header into y;
 * each sub-block's scale and min into d and dm; -1 where they overflow half precision (nothing written then). */
INLINE int q2_k_weighted(const float *xb, const float *qwb, const vf *x, vi *L, uint8_t *y, float *d, float *dm) {
    vf w[16], the_min;
    const vf sum = sub_block_weights(x, qwb, sum_squares(xb) / QK_K, w);
    const vf found = kx_search(x, w, L, &the_min, 16, 3, -0.9f, 0.05f, 36, 0);
    float scales[LANES], mins[LANES], sw[LANES];
    memcpy(scales, &found, sizeof scales);
    memcpy(mins, &the_min, sizeof mins);
    memcpy(sw, &sum, sizeof sw);
    uint8_t ls[16], lm[16];
    const uint16_t hd = half_bits(make_qp(scales, ls, sw, 16, 15)), hm = half_bits(make_qp(mins, lm, sw, 16, 15));
    if ((hd & 0x7c00u) == 0x7c00u || (hm & 0x7c00u) == 0x7c00u) {
        return -1;
    }
    const float fd = half_float(hd), fm = half_float(hm);
    for (int j = 0; j < 16; j++) {
        y[j] = (uint8_t)(ls[j] | (lm[j] << 4));
        d[j] = fd * (y[j] & 0xF);
        dm[j] = fm * (y[j] >> 4);
    }
    y[80] = (uint8_t)(hd & 0xffu);
    y[81] = (uint8_t)(hd >> 8);
    y[82] = (uint8_t)(hm & 0xffu);
    y[83] = (uint8_t)(hm >> 8);
    return 0;
}

/* Q2_K's scales and mins without (quantize_row_q2_K_ref): the sub-blocks' make_qkx2_quants under |x| with |diff|
 * errors, their 4-bit quants unclamped as llama.cpp stores them; as q2_k_weighted. */
INLINE int q2_k_plain(const vf *x, vi *L, uint8_t *y, float *d, float *dm) {
    vf w[16], the_min;
    for (int i = 0; i < 16; i++) {
        w[i] = v_abs(x[i]);
    }
    const vf found = kx_search(x, w, L, &the_min, 16, 3, -0.5f, 0.1f, 15, 1);
    float scales[LANES], mins[LANES];
    memcpy(scales, &found, sizeof scales);
    memcpy(mins, &the_min, sizeof mins);
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; j++) {
        if (scales[j] > max_scale) {
            max_scale = scales[j];
        }
        if (mins[j] > max_min) {
            max_min = mins[j];
        }
    }
    uint8_t sc[16] = {0};
    uint16_t hd = half_bits(0.f), hm = half_bits(0.f);
    if (max_scale > 0) {
        const float iscale = 15.f / max_scale;
        for (int j = 0; j < 16; j++) {
            sc[j] = (uint8_t)nearest_int(iscale * scales[j]);
        }
        hd = half_bits(max_scale / 15.f);
    }
    if (max_min > 0) {
        const float iscale = 15.f / max_min;
        for (int j = 0; j < 16; j++) {
            sc[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
        }
        hm = half_bits(max_min / 15.f);
    }
    if ((hd & 0x7c00u) == 0x7c00u || (hm & 0x7c00u) == 0x7c00u) {
        return -1;
    }
    const float fd = half_float(hd), fm = half_float(hm);
    for (int j = 0; j < 16; j++) {
        d[j] = fd * (sc[j] & 0xF);
        dm[j] = fm * (sc[j] >> 4);
    }
    memcpy(y, sc, sizeof sc);
    y[80] = (uint8_t)(hd & 0xffu);
    y[81] = (uint8_t)(hd >> 8);
    y[82] = (uint8_t)(hm & 0xffu);
    y[83] = (uint8_t)(hm >> 8);
    return 0;
}

/* One Q2_K super-block, 16 sub-blocks of 16 one a lane, with its 256 importance weights `qw` or none (NULL); 0, or
 * -1 where its scales overflow half precision (nothing written then). */
INLINE int q2_k_block(const float *xb, const float *qw, uint8_t *y) {
    vf x[16];
    vi L[16];
    to_lanes(xb, 16, x);
    float dsub[LANES], msub[LANES];
    if ((qw ? q2_k_weighted(xb, qw, x, L, y, dsub, msub) : q2_k_plain(x, L, y, dsub, msub)) < 0) {
        return -1;
    }
    vf d, dm;
    memcpy(&d, dsub, sizeof d);
    memcpy(&dm, msub, sizeof dm);
    const vi nonzero = v_ne(d, v_splat(0.0f));
    for (int i = 0; i < 16; i++) { /* sub-blocks whose scale rounds to 0 keep the search's quants */
        L[i] = v_seli(nonzero, v_clamp(v_nearest((x[i] + dm) / d), 0, 3), L[i]);
    }
    uint8_t q[QK_K];
    for (int i = 0; i < 16; i++) {
        int32_t t[LANES];
        memcpy(t, &L[i], sizeof t);
        for (int s = 0; s < LANES; s++) {
            q[16 * s + i] = (uint8_t)t[s];
        }
    }
    uint8_t *qs = y + 16;
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = q[j + l] | (q[j + l + 32] << 2) | (q[j + l + 64] << 4) | (q[j + l + 96] << 6);
        }
    }
    return 0;
}

/* Encode `nblocks` Q2_K super-blocks of 256 floats from `x` into `y` (84 bytes each), as mreg_quantize_q6_k. */
MREG_CLONES
int64_t mreg_quantize_q2_k(const float *x, uint8_t *y, int64_t nblocks) {
    EACH_SUPER_BLOCK(q2_k_block, Q2_K_BYTES, NULL, 1, 0);
}

/* Q2_K with an importance matrix, as mreg_quantize_q6_k_w. */
MREG_CLONES
int64_t mreg_quantize_q2_k_w(const float *x, uint8_t *y, int64_t nblocks, const float *qw, int64_t row_blocks,
                             int64_t first) {
    EACH_SUPER_BLOCK(q2_k_block, Q2_K_BYTES, qw, row_blocks, first);
}

/* Q3_K (quantize_row_q3_K_ref, and quantize_row_q3_K_impl with importance weights). With weights the sub-blocks'
 * scales come from qx_search in lanes, as Q6_K's do. Without, each sub-block runs make_q3_quants' rmse search: up to
 * 5 sweeps over its 16 values, each value's best quant given the others' sums, a change kept when it lowers the
 * error, so every kept change moves the sums the next value sees. One value at a time in lanes, that is a chain of
 * divisions per sub-block, and the slowest of 16 lanes sets the pace (measured 1.8x slower than llama.cpp's scalar
 * loop, whose branch predictor runs ahead on the usual "no change"). Here the first quants, their sums and the first
 * sweep's first pass run in lanes, a sub-block a lane; most sub-blocks have nothing to change there and are done.
 * The others sweep alone, their 16 values one vector: each pass evaluates all of them against the sums as they
 * stand, independently, and keeps only the first change at or after the sweep's place. The values before it saw the
 * same sums in the reference; those after it are evaluated again in the next pass, against the new sums. A sweep
 * ends at a pass with nothing to keep. So such a sub-block costs a pass per kept change and per sweep (on normal
 * weights 0.43 changes and 1.26 sweeps a sub-block). */

#define Q3_K_BYTES 110

/* The lowest lane of a mask that is set, or LANES where none is. */
INLINE int first_lane(vi mask) {
    int32_t t[LANES];
    memcpy(t, &mask, sizeof t);
    uint32_t bits = 1u << LANES;
    for (int s = 0; s < LANES; s++) {
        bits |= (uint32_t)(t[s] & 1) << s;
    }
    return __builtin_ctz(bits);
}

/* The sweeps of make_q3_quants(16, 4, x, L, true) on one sub-block, its 16 values x one vector, from its first quants
 * L and their sums. Returns the scale, q the quants + 4. */
INLINE float q3_k_sweeps(vf x, vi L, float sumlx, float suml2, uint8_t *q) {
    const vf zero = {0}, w = x * x, wx = w * x;
    vi lane;
    for (int s = 0; s < LANES; s++) {
        lane[s] = s;
    }
    for (int sweep = 0; sweep < 5; ++sweep) {
        int changed = 0;
        for (int start = 0; start < 16;) {
            const vf fl = v_float(L);
            const vf slx = v_splat(sumlx) - wx * fl, sl2 = v_splat(suml2) - w * fl * fl;
            const vi nl = v_clamp(v_nearest(x * sl2 / slx), -4, 3);
            const vf n = v_float(nl), slx_new = slx + wx * n, sl2_new = sl2 + w * n * n;
            const int at = first_lane(v_gt(slx, zero) & v_gt(sl2_new, zero)
                                      & v_gt(slx_new * slx_new * v_splat(suml2), v_splat(sumlx * sumlx) * sl2_new)
                                      & v_nei(nl, L) & v_gei(lane, v_splat_i(start)));
            if (at == LANES) {
                break;
            }
            L[at] = nl[at];
            sumlx = slx_new[at];
            suml2 = sl2_new[at];
            ++changed;
            start = at + 1;
        }
        if (!changed) {
            break;
        }
    }
    for (int i = 0; i < 16; ++i) {
        q[i] = (uint8_t)(L[i] + 4);
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* make_q3_quants(16, 4, x, L, true) on the 16 sub-blocks of xb: their scales, q their quants + 4 (0 in an empty
 * sub-block). The first quants, their sums and the first sweep's first pass run in lanes, a sub-block a lane; a
 * sub-block with nothing to change there is done (most are), the others sweep on their own (q3_k_sweeps). */
INLINE void q3_k_search(const float *xb, float *scales, uint8_t *q) {
    vf x[16], w[16], wx[16], amax = {0}, max = {0}, sumlx = {0}, suml2 = {0};
    vi L[16];
    to_lanes(xb, 16, x);
    for (int i = 0; i < 16; i++) {
        const vf ax = v_abs(x[i]);
        const vi bigger = v_gt(ax, amax);
        amax = v_sel(bigger, ax, amax);
        max = v_sel(bigger, x[i], max);
    }
    const vf zero = {0}, iscale = v_splat(-4.0f) / max;
    for (int i = 0; i < 16; i++) {
        L[i] = v_clamp(v_nearest(iscale * x[i]), -4, 3);
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
        const vf l = v_float(L[i]);
        sumlx = sumlx + wx[i] * l;
        suml2 = suml2 + w[i] * l * l;
    }
    const vi empty = v_lt(amax, v_splat(GROUP_MAX_EPS)); /* all zero: no search (its lanes computed, not read) */
    vi change = v_splat_i(0);
    const vf sq = sumlx * sumlx;
    for (int i = 0; i < 16; i++) {
        const vf l = v_float(L[i]);
        const vf slx = sumlx - wx[i] * l, sl2 = suml2 - w[i] * l * l;
        const vi nl = v_clamp(v_nearest(x[i] * sl2 / slx), -4, 3);
        const vf n = v_float(nl), slx_new = slx + wx[i] * n, sl2_new = sl2 + w[i] * n * n;
        change = change | (v_gt(slx, zero) & v_gt(sl2_new, zero) & v_gt(slx_new * slx_new * suml2, sq * sl2_new)
                           & v_nei(nl, L[i]));
    }
    const vf scale = v_sel(v_gt(suml2, zero), sumlx / suml2, zero);
    for (int s = 0; s < LANES; s++) {
        if (empty[s]) {
            scales[s] = 0.f;
            memset(q + 16 * s, 0, 16);
        } else if (!change[s]) {
            scales[s] = scale[s];
            for (int i = 0; i < 16; i++) {
                q[16 * s + i] = (uint8_t)(L[i][s] + 4);
            }
        } else {
            vf xs;
            vi ls;
            memcpy(&xs, xb + 16 * s, sizeof xs);
            for (int i = 0; i < 16; i++) {
                ls[i] = L[i][s];
            }
            scales[s] = q3_k_sweeps(xs, ls, sumlx[s], suml2[s], q + 16 * s);
        }
    }
}

/* make_qx_quants(n, nmax, x, L, 1, qw), scalar: Q3_K's 6-bit quants of its 16 sub-block scales under their summed
 * importance (quantize_row_q3_K_impl). Returns the super-block's scale, L the quants + nmax. */
INLINE float make_qx(const float *x, int8_t *L, const float *qw, int n, int nmax) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)(l + nmax);
        sumlx += qw[i] * x[i] * l;
        suml2 += qw[i] * l * l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) {
            continue;
        }
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            sumlx += qw[i] * x[i] * l;
            suml2 += qw[i] * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's 16 scales, 6 bits each (biased by 32), into its 12 bytes as llama.cpp packs them. */
INLINE void q3_k_pack_scales(const int *ls, uint8_t *sc) {
    memset(sc, 0, 12);
    for (int j = 0; j < 16; j++) {
        int l = ls[j];
        if (j < 8) {
            sc[j] = (uint8_t)(l & 0xF);
        } else {
            sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
        }
        l >>= 4;
        sc[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
    }
}

/* One Q3_K super-block with its 256 importance weights `qw` or none (NULL); 0, or -1 where its scale overflows half
 * precision (nothing written then). */
INLINE int q3_k_block(const float *xb, const float *qw, uint8_t *y) {
    uint8_t q[QK_K];
    float scales[LANES];
    int ls[16];
    uint16_t hd;
    if (qw) { /* 16 sub-blocks of 16 one a lane */
        vf x[16], w[16];
        vi L[16];
        to_lanes(xb, 16, x);
        const vf sum = sub_block_weights(x, qw, 2 * sum_squares(xb) / QK_K, w);
        const vf found = qx_search(x, w, L, 4);
        memcpy(scales, &found, sizeof scales);
        for (int i = 0; i < 16; i++) {
            for (int s = 0; s < LANES; s++) {
                q[16 * s + i] = (uint8_t)L[i][s];
            }
        }
        float sw[LANES];
        memcpy(sw, &sum, sizeof sw);
        int8_t q6[16];
        hd = half_bits(make_qx(scales, q6, sw, 16, 32));
        for (int j = 0; j < 16; j++) {
            ls[j] = q6[j];
        }
    } else {
        float max_scale = 0, amax = 0;
        q3_k_search(xb, scales, q);
        for (int j = 0; j < 16; j++) {
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(ls, 0, sizeof ls);
        hd = half_bits(0.f);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = (int8_t)nearest_int(iscale * scales[j]);
                ls[j] = (l < -32 ? -32 : l > 31 ? 31 : l) + 32;
            }
            hd = half_bits(1 / iscale);
        }
    }
    if ((hd & 0x7c00u) == 0x7c00u) {
        return -1;
    }
    uint8_t *sc = y + 96;
    q3_k_pack_scales(ls, sc);
    const float dh = half_float(hd);
    for (int j = 0; j < 16; j++) { /* each scale as llama.cpp reads it back; 0 keeps the search's quants */
        const int low = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
        const float d = dh * (float)((int8_t)(low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
        if (d == 0) {
            continue;
        }
        vf x;
        memcpy(&x, xb + 16 * j, sizeof x);
        const vi l = v_clamp(v_nearest(x / v_splat(d)), -4, 3) + 4;
        for (int i = 0; i < 16; i++) {
            q[16 * j + i] = (uint8_t)l[i];
        }
    }
    uint8_t *hmask = y, *qs = y + 32;
    memset(hmask, 0, 32);
    for (int j = 0; j < QK_K; j++) { /* the high bit of quant j in bit j / 32 of byte j % 32 (no branch: half are) */
        hmask[j % 32] |= (uint8_t)((q[j] >> 2) << (j / 32));
        q[j] &= 3;
    }
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; l++) {
            qs[j / 4 + l] = q[j + l] | (q[j + l + 32] << 2) | (q[j + l + 64] << 4) | (q[j + l + 96] << 6);
        }
    }
    y[108] = (uint8_t)(hd & 0xffu);
    y[109] = (uint8_t)(hd >> 8);
    return 0;
}

/* Encode `nblocks` Q3_K super-blocks of 256 floats from `x` into `y` (110 bytes each), as mreg_quantize_q6_k. */
MREG_CLONES
int64_t mreg_quantize_q3_k(const float *x, uint8_t *y, int64_t nblocks) {
    EACH_SUPER_BLOCK(q3_k_block, Q3_K_BYTES, NULL, 1, 0);
}

/* Q3_K with an importance matrix, as mreg_quantize_q6_k_w. */
MREG_CLONES
int64_t mreg_quantize_q3_k_w(const float *x, uint8_t *y, int64_t nblocks, const float *qw, int64_t row_blocks,
                             int64_t first) {
    EACH_SUPER_BLOCK(q3_k_block, Q3_K_BYTES, qw, row_blocks, first);
}
