#include "common.h"

/* y[t] += (x[t] A_s^T) B_s^T, rounded to bf16 once, for each row t of an adapter s = slot[t]
 * (0: the base, left alone). A [S][R][K] and B^T [S][R][N] in float32 (an adapter's rank padded
 * with zeros). u[r] = x[t] . A_s[r]: products in lane i % 16, then tree_sum16's order; then for
 * each output j, d = u[0] B[0][j] + u[1] B[1][j] + ... fused multiply-adds in r's order. One
 * thread a row, so every element's order is fixed by that row alone: an adapter's rows are the
 * same bits in any batch. */
void sy_lora_add(const bf16 *x, int64_t T, int64_t K, int64_t ldx, const int32_t *slot, const float *A, const float *B, int64_t R, int64_t N,
                 bf16 *y, int64_t ldy, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; t++) {
        int s = slot[t];
        if (s <= 0) continue;
        const bf16 *xr = x + t * ldx;
        const float *a = A + (int64_t)(s - 1) * R * K, *b = B + (int64_t)(s - 1) * R * N;
        float *u = (float *)malloc(sizeof(float) * (size_t)R);
        for (int64_t r = 0; r < R; r++) {
            const float *ar = a + r * K;
            float lanes[16] = {0};
            int64_t i = 0;
#ifdef __AVX512BF16__
            __m512 acc = _mm512_setzero_ps();
            for (; i + 16 <= K; i += 16) {
                __m512 xv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(xr + i))), 16));
                acc = _mm512_fmadd_ps(xv, _mm512_loadu_ps(ar + i), acc);
            }
            _mm512_storeu_ps(lanes, acc);
#endif
            for (; i < K; i++) lanes[i % 16] = fmaf(bf16_f32(xr[i]), ar[i], lanes[i % 16]);
            u[r] = tree_sum16(lanes);
        }
        bf16 *yr = y + t * ldy;
        int64_t j = 0;
#ifdef __AVX512BF16__
        for (; j + 16 <= N; j += 16) {
            __m512 d = _mm512_setzero_ps();
            for (int64_t r = 0; r < R; r++) d = _mm512_fmadd_ps(_mm512_set1_ps(u[r]), _mm512_loadu_ps(b + r * N + j), d);
            __m512 yv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(yr + j))), 16));
            _mm256_storeu_si256((__m256i *)(yr + j), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(yv, d)));
        }
#endif
        for (; j < N; j++) {
            float d = 0.0f;
            for (int64_t r = 0; r < R; r++) d = fmaf(u[r], b[r * N + j], d);
            yr[j] = f32_bf16(bf16_f32(yr[j]) + d);
        }
        free(u);
    }
}
