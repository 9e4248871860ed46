#include "common.h"

/* y = w * bf16(x * rsqrt(mean(x^2) + eps)) per row, as transformers' RMSNorm rounds it (the
 * normalised row in the activations' dtype before the weight); the squares summed in lane
 * i % 16, then the tree of attention.c. */
void sy_rmsnorm(const bf16 *x, int64_t M, int64_t D, int64_t ldx, const bf16 *w, float eps, bf16 *y, int64_t ldy, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++) {
        const bf16 *row = x + m * ldx;
        float lanes[16] = {0};
        for (int64_t i = 0; i < D; i++) {
            float v = bf16_f32(row[i]);
            lanes[i % 16] = fmaf(v, v, lanes[i % 16]);
        }
        float a[8], b[4];
        for (int i = 0; i < 8; i++) a[i] = lanes[i] + lanes[i + 8];
        for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
        float sum = (b[0] + b[2]) + (b[1] + b[3]);
        float r = 1.0f / sqrtf(sum / (float)D + eps);
        for (int64_t i = 0; i < D; i++) y[m * ldy + i] = f32_bf16(bf16_f32(w[i]) * bf16_f32(f32_bf16(bf16_f32(row[i]) * r)));
    }
}

/* Rotary on the q and k parts of each row of `qkv` [T, (H + 2 KVH) D] (rotate-half layout, fp32
 * cos/sin tables [positions, D], one rounding), q into q_out [T, H, D], rotated k and v into the
 * cache [KVH, S, D] at each row's slot. */
void sy_rope_write(const bf16 *qkv, int64_t T, int64_t ld, int H, int KVH, int D, const float *cos, const float *sin,
                   const int64_t *pos, const int64_t *slots, bf16 *q_out, bf16 *kc, bf16 *vc, int64_t S, int threads) {
    int half = D / 2;
#pragma omp parallel for num_threads(threads) schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + pos[t] * D, *s = sin + pos[t] * D;
        const bf16 *row = qkv + t * ld;
        for (int h = 0; h < H + KVH; h++) {
            const bf16 *x = row + (int64_t)h * D;
            bf16 *dst = h < H ? q_out + (t * H + h) * D : kc + ((int64_t)(h - H) * S + slots[t]) * D;
            for (int i = 0; i < D; i++) {
                float rot = i < half ? -bf16_f32(x[i + half]) : bf16_f32(x[i - half]);
                float a = bf16_f32(x[i]) * c[i], b = rot * s[i];
                dst[i] = f32_bf16(a + b);
            }
        }
        const bf16 *v = row + (int64_t)(H + KVH) * D;
        for (int h = 0; h < KVH; h++) memcpy(vc + ((int64_t)h * S + slots[t]) * D, v + (int64_t)h * D, sizeof(bf16) * D);
    }
}

/* y[m, i] = bf16(bf16(silu(g)) * u) for the gate g = gu[m, i] and up u = gu[m, I + i], as
 * transformers rounds SwiGLU (the activation in bf16, then the product); silu(g) = g / (1 + e^-g). */
void sy_silu_mul(const bf16 *gu, int64_t M, int64_t I, bf16 *y, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++) {
        const bf16 *g = gu + m * 2 * I, *u = g + I;
        bf16 *out = y + m * I;
        int64_t i = 0;
#ifdef __AVX512BF16__
        for (; i + 16 <= I; i += 16) {
            __m512 gv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(g + i))), 16));
            __m512 uv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(u + i))), 16));
            __m512 e = exp_vec(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            __m512 act = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            __m512 act16 = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(act));
            _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(act16, uv)));
        }
#endif
        for (; i < I; i++) {
            float gv = bf16_f32(g[i]);
            float act = bf16_f32(f32_bf16(gv / (1.0f + exp_one(0.0f - gv))));
            out[i] = f32_bf16(act * bf16_f32(u[i]));
        }
    }
}
