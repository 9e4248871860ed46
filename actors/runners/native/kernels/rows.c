#include "common.h"

/* y = RMSNorm(x) row by row (common.h `rmsnorm_row`). */
void sy_rmsnorm(const bf16 *x, int64_t M, int64_t D, int64_t ldx, const bf16 *w, float eps, bf16 *y, int64_t ldy, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; m++) rmsnorm_row(x + m * ldx, D, w, eps, y + m * ldy);
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

void sy_attention(const bf16 *q, int64_t T, int H, int KVH, int D, const bf16 *kc, const bf16 *vc, int64_t S, const int32_t *tables,
                  int64_t tstride, int bs, const int32_t *row_seq, const int32_t *row_pos, int window, float scale, bf16 *out, int threads);

/* sy_rope_write, then sy_attention over the rotated q: one call for a layer's attention. */
void sy_rope_attention(const bf16 *qkv, int64_t T, int64_t ld, int H, int KVH, int D, const float *cos, const float *sin, const int64_t *pos,
                       const int64_t *slots, bf16 *kc, bf16 *vc, int64_t S, const int32_t *tables, int64_t tstride, int bs, const int32_t *row_seq,
                       int window, float scale, bf16 *out, int threads) {
    bf16 *q = (bf16 *)malloc(sizeof(bf16) * (size_t)(T * H * D));
    int32_t *row_pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) row_pos[t] = (int32_t)pos[t];
    sy_rope_write(qkv, T, ld, H, KVH, D, cos, sin, pos, slots, q, kc, vc, S, threads);
    sy_attention(q, T, H, KVH, D, kc, vc, S, tables, tstride, bs, row_seq, row_pos, window, scale, out, threads);
    free(q);
    free(row_pos);
}
