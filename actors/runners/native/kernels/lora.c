#include "common.h"

#ifdef __AVX512BF16__
static inline __m512 load_bf16(const bf16 *p) { /* 16 bf16 as float32, exactly */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#endif

/* u[r] = x . a[r] for r < R: products in lane i % 16, then tree_sum16's order. Four r at a time
 * share each load of x (four independent sums: the FMA's latency, not its rate, bounded one). */
static void lora_down(const bf16 *x, int64_t K, const bf16 *a, int64_t R, float *u) {
    int64_t r = 0;
#ifdef __AVX512BF16__
    for (; r + 4 <= R && K % 16 == 0; r += 4) {
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t i = 0; i < K; i += 16) {
            __m512 xv = load_bf16(x + i);
            for (int k = 0; k < 4; k++) acc[k] = _mm512_fmadd_ps(xv, load_bf16(a + (r + k) * K + i), acc[k]);
        }
        for (int k = 0; k < 4; k++) {
            float lanes[16];
            _mm512_storeu_ps(lanes, acc[k]);
            u[r + k] = tree_sum16(lanes);
        }
    }
#endif
    for (; r < R; r++) {
        const bf16 *ar = a + r * K;
        float lanes[16] = {0};
        for (int64_t i = 0; i < K; i++) lanes[i % 16] = fmaf(bf16_f32(x[i]), bf16_f32(ar[i]), lanes[i % 16]);
        u[r] = tree_sum16(lanes);
    }
}

/* y[j] = bf16(y[j] + d[j]) for j < width (at most 64), d[j] = u[0] b[0][j] + u[1] b[1][j] + ...
 * in r's order (b's rows N apart); four 16-column sums at a time when the width is 64. */
static void lora_up(const float *u, const bf16 *b, int64_t R, int64_t N, int64_t width, bf16 *y) {
    int64_t j = 0;
#ifdef __AVX512BF16__
    if (width == 64) {
        __m512 d[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t r = 0; r < R; r++) {
            __m512 ur = _mm512_set1_ps(u[r]);
            for (int k = 0; k < 4; k++) d[k] = _mm512_fmadd_ps(ur, load_bf16(b + r * N + 16 * k), d[k]);
        }
        for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(y + 16 * k), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(load_bf16(y + 16 * k), d[k])));
        return;
    }
    for (; j + 16 <= width; j += 16) {
        __m512 d = _mm512_setzero_ps();
        for (int64_t r = 0; r < R; r++) d = _mm512_fmadd_ps(_mm512_set1_ps(u[r]), load_bf16(b + r * N + j), d);
        _mm256_storeu_si256((__m256i *)(y + j), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(load_bf16(y + j), d)));
    }
#endif
    for (; j < width; j++) {
        float d = 0.0f;
        for (int64_t r = 0; r < R; r++) d = fmaf(u[r], bf16_f32(b[r * N + j]), d);
        y[j] = f32_bf16(bf16_f32(y[j]) + d);
    }
}

/* y[t] += (x[t] A_s^T) B_s^T, rounded to bf16 once, for each row t of an adapter s = slot[t]
 * (0: the base, left alone). A [S][R][K] and B^T [S][R][N] in bf16 (an adapter's rank padded
 * with zeros; bf16 halves what a step reads of them). `order` lists the n rows with an adapter,
 * grouped by adapter, so the second product reads each adapter's B once a 64-column group for
 * all its rows (from L1 after the first). Every element's order is fixed by its own row
 * (lora_down, lora_up): an adapter's rows are the same bits in any batch. */
void sy_lora_add(const bf16 *x, int64_t T, int64_t K, int64_t ldx, const int32_t *slot, const int32_t *order, int64_t n, const bf16 *A,
                 const bf16 *B, int64_t R, int64_t N, bf16 *y, int64_t ldy, int threads) {
    (void)T;
    float *U = (float *)malloc(sizeof(float) * (size_t)(n * R));
#pragma omp parallel for num_threads(threads) schedule(static) if (n > 1)
    for (int64_t o = 0; o < n; o++) lora_down(x + order[o] * ldx, K, A + (int64_t)(slot[order[o]] - 1) * R * K, R, U + o * R);
    int64_t groups = (N + 63) / 64;
#pragma omp parallel for num_threads(threads) schedule(static) if (groups > 1)
    for (int64_t g = 0; g < groups; g++) {
        int64_t j0 = g * 64, width = N - j0 < 64 ? N - j0 : 64;
        for (int64_t o = 0; o < n; o++) {
            int64_t t = order[o];
            lora_up(U + o * R, B + (int64_t)(slot[t] - 1) * R * N + j0, R, N, width, y + t * ldy + j0);
        }
    }
    free(U);
}
