/* Row-invariant CPU kernels for the native Llama-family path (actors/runners/native/kernels).
 *
 * Every output element is computed by one thread, in one fixed order that depends on nothing
 * but that element's own inputs: never on how many rows share the call, which thread takes
 * them, or which other rows sit beside them. So a position's logits are the same bits whether
 * it is decoded alone, beside 63 other streams, as a draft's verify row or as the last token
 * of a prompt chunk.
 *
 *   sy_linear     y = x W^T (+ b): bf16 activations, weights as bf16 pairs or as the GGUF blocks
 *                 Q4_1 / Q8_0 dequantized to bf16 on the fly; fp32 sums over K in order
 *                 (pairs as VDPBF16PS adds them: the odd element, then the even one).
 *   sy_attention  each row attends its own sequence's keys 0..pos through the block table,
 *                 in the paged cache, no gather: fp32 scores, softmax, fp32 sum of values.
 *   sy_rope_write rotary on q and k (fp32, one rounding) and k, v into their cache slots.
 *   sy_rmsnorm    x * rsqrt(mean(x^2) + eps) * w, as transformers rounds it, per row.
 *
 * With AVX512-BF16 (Zen 4/5, Sapphire Rapids on) the sums run on VDPBF16PS; elsewhere a plain C
 * loop adds the same products in the same order (only denormals may round otherwise).
 */
#ifndef SY_COMMON_H
#define SY_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

typedef uint16_t bf16;
typedef uint16_t fp16;

enum { FMT_BF16 = 0, FMT_Q4_1 = 1, FMT_Q8_0 = 2 };
/* A 16-column block of a packed weight, per 32 input columns (16 pairs): */
#define Q4_1_BYTES 320 /* 16 pairs x 16 lanes of two nibbles (even k low), d[16], m[16] as fp16 */
#define Q8_0_BYTES 544 /* 16 pairs x (16 even-k, 16 odd-k int8), d[16] as fp16 */

static inline __attribute__((unused)) float bf16_f32(bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline bf16 f32_bf16(float f) { /* round to nearest even, as VCVTNEPS2BF16 */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

static inline float fp16_f32(fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else { /* subnormal half: normalise */
        exp = 113;
        while (!(man & 0x400)) { man <<= 1; exp--; }
        u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}


/* Sums and exp shared by the vector and the plain C loops, so both add in one order. */
#ifdef __AVX512BF16__
static inline __attribute__((unused)) float tree_sum(__m512 v) { /* lanes i + 8, then i + 4, i + 2, i + 1 */
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

static inline __attribute__((unused)) __m512 exp_vec(__m512 x) { /* Cephes' expf: n ln2 + r, a degree-6 polynomial in r */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

static inline __attribute__((unused)) float tree_sum16(const float v[16]) {
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline __attribute__((unused)) float exp_one(float x) {
    x = x > -87.0f ? x : -87.0f;
    float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    return ldexpf(p, (int)n);
}

/* One row of y = w * bf16(x * rsqrt(mean(x^2) + eps)), as transformers' RMSNorm rounds it (the
 * normalised row in the activations' dtype before the weight); squares summed in lane i % 16,
 * then tree_sum16's order. */
static inline __attribute__((unused)) void rmsnorm_row(const bf16 *row, int64_t D, const bf16 *w, float eps, bf16 *out) {
    float lanes[16] = {0};
    for (int64_t i = 0; i < D; i++) {
        float v = bf16_f32(row[i]);
        lanes[i % 16] = fmaf(v, v, lanes[i % 16]);
    }
    float r = 1.0f / sqrtf(tree_sum16(lanes) / (float)D + eps);
    for (int64_t i = 0; i < D; i++) out[i] = f32_bf16(bf16_f32(w[i]) * bf16_f32(f32_bf16(bf16_f32(row[i]) * r)));
}
#endif
