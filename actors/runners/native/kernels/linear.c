#include "common.h"

/* sy_linear: y = x W^T, W in 16-column blocks (bf16 pairs, Q4_1 or Q8_0), with the epilogue
 * the native layer wants fused: + bias, SwiGLU over interleaved gate/up blocks, + residual.
 * Each output element is summed over K by one thread, pair by pair in order. */

static int64_t packed_block_bytes(int fmt, int64_t K) {
    return fmt == FMT_BF16 ? K * 32 : (K / 32) * (fmt == FMT_Q4_1 ? Q4_1_BYTES : Q8_0_BYTES);
}

/* The 16 pair vectors of block `blk`'s group g (input columns 32g .. 32g + 31), as 32-bit words
 * (lane i: column i's even weight in the low half, its odd weight in the high half). */
static inline void dequant_group(int fmt, const uint8_t *blk, int64_t g, uint32_t *out) {
#ifdef __AVX512BF16__
    static const uint16_t interleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                            8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i perm = _mm512_loadu_si512(interleave);
    if (fmt == FMT_Q4_1) {
        const uint8_t *base = blk + g * Q4_1_BYTES;
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + 256)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + 288)));
        for (int p = 0; p < 16; p++) {
            __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(base + p * 16)));
            __m512 even = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))), d, m);
            __m512 odd = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, m);
            _mm512_storeu_si512(out + p * 16, _mm512_permutexvar_epi16(perm, (__m512i)_mm512_cvtne2ps_pbh(odd, even)));
        }
    } else {
        const uint8_t *base = blk + g * Q8_0_BYTES;
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + 512)));
        for (int p = 0; p < 16; p++) {
            __m512 even = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(base + p * 32)))), d);
            __m512 odd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(base + p * 32 + 16)))), d);
            _mm512_storeu_si512(out + p * 16, _mm512_permutexvar_epi16(perm, (__m512i)_mm512_cvtne2ps_pbh(odd, even)));
        }
    }
#else
    for (int i = 0; i < 16; i++) {
        for (int p = 0; p < 16; p++) {
            float even, odd;
            if (fmt == FMT_Q4_1) {
                const uint8_t *base = blk + g * Q4_1_BYTES;
                const fp16 *d = (const fp16 *)(base + 256), *m = d + 16;
                float s = fp16_f32(d[i]), z = fp16_f32(m[i]);
                uint8_t q = base[p * 16 + i];
                even = (float)(q & 15) * s + z;
                odd = (float)(q >> 4) * s + z;
            } else {
                const uint8_t *base = blk + g * Q8_0_BYTES;
                float s = fp16_f32(((const fp16 *)(base + 512))[i]);
                even = (float)(int8_t)base[p * 32 + i] * s;
                odd = (float)(int8_t)base[p * 32 + 16 + i] * s;
            }
            out[p * 16 + i] = (uint32_t)f32_bf16(even) | ((uint32_t)f32_bf16(odd) << 16);
        }
    }
#endif
}

/* acc[i][j] = rows m0 .. m0 + mr - 1 of x times blocks j < nr, from each block's pair vectors:
 * `pairs(j, kp)` is block j's vector at pair kp. */
#ifdef __AVX512BF16__
#define TILE_BODY(MR, NR, PAIRS)                                                                      \
    do {                                                                                              \
        __m512 c[MR][NR];                                                                             \
        for (int i = 0; i < MR; i++)                                                                  \
            for (int j = 0; j < NR; j++) c[i][j] = _mm512_setzero_ps();                               \
        for (int64_t kp = 0; kp < KP; kp++) {                                                         \
            __m512i b[NR];                                                                            \
            for (int j = 0; j < NR; j++) b[j] = _mm512_loadu_si512(PAIRS(j, kp));                     \
            for (int i = 0; i < MR; i++) {                                                            \
                __m512i a = _mm512_set1_epi32(*(const int32_t *)(x + i * ldx + 2 * kp));              \
                for (int j = 0; j < NR; j++) c[i][j] = _mm512_dpbf16_ps(c[i][j], (__m512bh)a, (__m512bh)b[j]); \
            }                                                                                         \
        }                                                                                             \
        for (int i = 0; i < MR; i++)                                                                  \
            for (int j = 0; j < NR; j++) _mm512_storeu_ps(acc[i][j], c[i][j]);                        \
    } while (0)
#else
#define TILE_BODY(MR, NR, PAIRS)                                                                      \
    do {                                                                                              \
        for (int i = 0; i < MR; i++)                                                                  \
            for (int j = 0; j < NR; j++) {                                                            \
                float *c = acc[i][j];                                                                 \
                for (int l = 0; l < 16; l++) c[l] = 0.0f;                                             \
                for (int64_t kp = 0; kp < KP; kp++) {                                                 \
                    const bf16 *w = (const bf16 *)(PAIRS(j, kp));                                     \
                    float a0 = bf16_f32(x[i * ldx + 2 * kp]), a1 = bf16_f32(x[i * ldx + 2 * kp + 1]);  \
                    for (int l = 0; l < 16; l++) {                                                    \
                        c[l] += a1 * bf16_f32(w[2 * l + 1]);                                          \
                        c[l] += a0 * bf16_f32(w[2 * l]);                                              \
                    }                                                                                 \
                }                                                                                     \
            }                                                                                         \
    } while (0)
#endif

/* From a panel of dequantized (or bf16) pair vectors: block j's run of KP vectors at panel + j * stride. */
#define PANEL_PAIRS(j, kp) (panel + ((int64_t)(j) * stride + (kp)) * 16)

__attribute__((optimize("no-tree-vectorize"))) static void tile(
    const bf16 *x, int64_t ldx, int mr, const uint32_t *panel, int64_t stride, int64_t KP, int nr, float acc[4][4][16]) {
#define T(MR, NR) TILE_BODY(MR, NR, PANEL_PAIRS)
    switch (mr * 8 + nr) { /* constant shapes, so each loop nest unrolls into registers */
    case 011: T(1, 1); break; case 012: T(1, 2); break; case 013: T(1, 3); break; case 014: T(1, 4); break;
    case 021: T(2, 1); break; case 022: T(2, 2); break; case 023: T(2, 3); break; case 024: T(2, 4); break;
    case 031: T(3, 1); break; case 032: T(3, 2); break; case 033: T(3, 3); break; case 034: T(3, 4); break;
    case 041: T(4, 1); break; case 042: T(4, 2); break; case 043: T(4, 3); break; default: T(4, 4); break;
    }
#undef T
}

#ifdef __AVX512BF16__
/* Few rows: each group's pair vectors dequantized in registers and used at once (no panel). The
 * same vectors, in the same order, as `tile` reads from a panel: the same sums. */
static inline __attribute__((always_inline)) void direct_body(
    const int FMT, const int MR, const int NR, const bf16 *x, int64_t ldx, const uint8_t *w, int64_t block, int64_t G, float acc[4][4][16]) {
    static const uint16_t interleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                            8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i perm = _mm512_loadu_si512(interleave);
    __m512 c[4][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) c[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512 d[4], m[4];
        const uint8_t *base[4];
        for (int j = 0; j < NR; j++) {
            base[j] = w + j * block + g * (FMT == FMT_Q4_1 ? Q4_1_BYTES : Q8_0_BYTES);
            d[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base[j] + (FMT == FMT_Q4_1 ? 256 : 512))));
            if (FMT == FMT_Q4_1) m[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base[j] + 288)));
        }
        for (int p = 0; p < 16; p++) {
            __m512i b[4];
            for (int j = 0; j < NR; j++) {
                __m512 even, odd;
                if (FMT == FMT_Q4_1) {
                    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(base[j] + p * 16)));
                    even = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))), d[j], m[j]);
                    odd = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d[j], m[j]);
                } else {
                    even = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(base[j] + p * 32)))), d[j]);
                    odd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(base[j] + p * 32 + 16)))), d[j]);
                }
                b[j] = _mm512_permutexvar_epi16(perm, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
            }
            int64_t kp = g * 16 + p;
            for (int i = 0; i < MR; i++) {
                __m512i a = _mm512_set1_epi32(*(const int32_t *)(x + i * ldx + 2 * kp));
                for (int j = 0; j < NR; j++) c[i][j] = _mm512_dpbf16_ps(c[i][j], (__m512bh)a, (__m512bh)b[j]);
            }
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) _mm512_storeu_ps(acc[i][j], c[i][j]);
}

static void direct(int fmt, int mr, int nr, const bf16 *x, int64_t ldx, const uint8_t *w, int64_t block, int64_t G, float acc[4][4][16]) {
#define D(F, MR, NR) direct_body(F, MR, NR, x, ldx, w, block, G, acc)
    if (fmt == FMT_Q4_1) {
        switch (mr * 8 + nr) {
        case 011: D(FMT_Q4_1, 1, 1); break; case 012: D(FMT_Q4_1, 1, 2); break; case 013: D(FMT_Q4_1, 1, 3); break; case 014: D(FMT_Q4_1, 1, 4); break;
        case 021: D(FMT_Q4_1, 2, 1); break; case 022: D(FMT_Q4_1, 2, 2); break; case 023: D(FMT_Q4_1, 2, 3); break; case 024: D(FMT_Q4_1, 2, 4); break;
        case 031: D(FMT_Q4_1, 3, 1); break; case 032: D(FMT_Q4_1, 3, 2); break; case 033: D(FMT_Q4_1, 3, 3); break; case 034: D(FMT_Q4_1, 3, 4); break;
        case 041: D(FMT_Q4_1, 4, 1); break; case 042: D(FMT_Q4_1, 4, 2); break; case 043: D(FMT_Q4_1, 4, 3); break; default: D(FMT_Q4_1, 4, 4); break;
        }
    } else {
        switch (mr * 8 + nr) {
        case 011: D(FMT_Q8_0, 1, 1); break; case 012: D(FMT_Q8_0, 1, 2); break; case 013: D(FMT_Q8_0, 1, 3); break; case 014: D(FMT_Q8_0, 1, 4); break;
        case 021: D(FMT_Q8_0, 2, 1); break; case 022: D(FMT_Q8_0, 2, 2); break; case 023: D(FMT_Q8_0, 2, 3); break; case 024: D(FMT_Q8_0, 2, 4); break;
        case 031: D(FMT_Q8_0, 3, 1); break; case 032: D(FMT_Q8_0, 3, 2); break; case 033: D(FMT_Q8_0, 3, 3); break; case 034: D(FMT_Q8_0, 3, 4); break;
        case 041: D(FMT_Q8_0, 4, 1); break; case 042: D(FMT_Q8_0, 4, 2); break; case 043: D(FMT_Q8_0, 4, 3); break; default: D(FMT_Q8_0, 4, 4); break;
        }
    }
#undef D
}
#endif

/* The epilogue of rows i < mr, blocks j < nr (block nb0 + j of W), into y. act 1: SwiGLU, the
 * blocks in (gate, up) pairs and y one block per pair: bf16(bf16(silu(bf16 gate)) * bf16 up).
 * Else bf16 (or fp32 when out_f32) of acc + bias, plus the residual row when given, as the
 * eager model rounds it: bf16(residual + bf16(acc)). */
static void epilogue(float acc[4][4][16], int mr, int nr, int64_t m, int64_t nb0, int64_t N, const float *bias, int act,
                     const bf16 *res, int64_t ldr, void *y, int out_f32, int64_t ldy) {
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j += act ? 2 : 1) {
            int64_t col = act ? (nb0 + j) / 2 * 16 : (nb0 + j) * 16;
            int width = act ? 16 : (int)(N - col < 16 ? N - col : 16);
#ifdef __AVX512BF16__
            __mmask16 k = (__mmask16)((1u << width) - 1);
            __m512 v = _mm512_loadu_ps(acc[i][j]);
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, bias + col));
            if (act) {
                __m512 g = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v));
                __m512 u = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_loadu_ps(acc[i][j + 1])));
                __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_vec(_mm512_sub_ps(_mm512_setzero_ps(), g))));
                v = _mm512_mul_ps(_mm512_cvtpbh_ps(_mm512_cvtneps_pbh(s)), u);
            } else if (res) {
                __m512 r = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, res + (m + i) * ldr + col)), 16));
                v = _mm512_add_ps(r, _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(v)));
            }
            if (out_f32) _mm512_mask_storeu_ps((float *)y + (m + i) * ldy + col, k, v);
            else _mm256_mask_storeu_epi16((bf16 *)y + (m + i) * ldy + col, k, (__m256i)_mm512_cvtneps_pbh(v));
#else
            float v[16];
            for (int l = 0; l < 16; l++) v[l] = acc[i][j][l] + (bias && l < width ? bias[col + l] : 0.0f);
            for (int l = 0; l < width; l++) {
                if (act) {
                    float g = bf16_f32(f32_bf16(v[l])), u = bf16_f32(f32_bf16(acc[i][j + 1][l]));
                    v[l] = bf16_f32(f32_bf16(g / (1.0f + exp_one(0.0f - g)))) * u;
                } else if (res) {
                    v[l] = bf16_f32(res[(m + i) * ldr + col + l]) + bf16_f32(f32_bf16(v[l]));
                }
                if (out_f32) ((float *)y)[(m + i) * ldy + col + l] = v[l];
                else ((bf16 *)y)[(m + i) * ldy + col + l] = f32_bf16(v[l]);
            }
#endif
        }
    }
}

/* y = x[M, K] W^T (+ bias), W packed in 16-column blocks of format `fmt`; norm: x's rows through
 * RMSNorm(norm, eps) first; act 1: SwiGLU over interleaved (gate, up) blocks, y [M, N / 2];
 * res: y = res + x W^T (y may be res itself). y bf16, or fp32 when `out_f32`. Tasks are
 * (column panel, row range): each dequantizes its panel once. */
void sy_linear(const bf16 *x, int64_t M, int64_t K, int64_t ldx, const bf16 *norm, float eps, const uint8_t *w, int fmt, int64_t N,
               const float *bias, int act, const bf16 *res, int64_t ldr, void *y, int out_f32, int64_t ldy, int threads) {
    int64_t NB = (N + 15) / 16, KP = K / 2, G = K / 32, block = packed_block_bytes(fmt, K);
    bf16 *normed = norm ? (bf16 *)malloc(sizeof(bf16) * (size_t)(M * K)) : NULL;
    int nr = NB >= 16 * threads ? 4 : NB >= 8 * threads || act ? 2 : 1; /* enough panels for every thread */
    if (act && NB % 4) nr = 2;
    int64_t panels = (NB + nr - 1) / nr;
    int64_t chunks = panels >= 2 * threads || M <= 8 ? 1 : (M + 7) / 8; /* rows split too when panels are few */
    if (chunks > 4 * threads) chunks = 4 * threads;
    int64_t rows_per = ((M + chunks - 1) / chunks + 3) / 4 * 4;
#pragma omp parallel num_threads(threads)
    {
        if (normed) { /* the prologue: x's rows through RMSNorm first (then the barrier) */
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) rmsnorm_row(x + m * ldx, K, norm, eps, normed + m * K);
        }
        const bf16 *xs = normed ? normed : x;
        int64_t ldxs = normed ? K : ldx;
        uint32_t *buf = fmt == FMT_BF16 ? NULL : (uint32_t *)aligned_alloc(64, (size_t)nr * KP * 64);
        float acc[4][4][16];
#pragma omp for schedule(static)
        for (int64_t task = 0; task < panels * chunks; task++) {
            int64_t p = task / chunks, r0 = (task % chunks) * rows_per, r1 = r0 + rows_per < M ? r0 + rows_per : M;
            int64_t nb0 = p * nr;
            int n_here = (int)(NB - nb0 < nr ? NB - nb0 : nr);
            if (r0 >= r1) continue;
            const uint32_t *panel = (const uint32_t *)(w + nb0 * block);
#ifdef __AVX512BF16__
            if (fmt != FMT_BF16 && r1 - r0 <= 4) { /* few rows: dequantize in registers */
                direct(fmt, (int)(r1 - r0), n_here, xs + r0 * ldxs, ldxs, w + nb0 * block, block, G, acc);
                epilogue(acc, (int)(r1 - r0), n_here, r0, nb0, N, bias, act, res, ldr, y, out_f32, ldy);
                continue;
            }
#endif
            if (fmt != FMT_BF16) {
                for (int j = 0; j < n_here; j++)
                    for (int64_t g = 0; g < G; g++) dequant_group(fmt, w + (nb0 + j) * block, g, buf + (j * KP + g * 16) * 16);
                panel = buf;
            }
            for (int64_t m = r0; m < r1; m += 4) {
                int mr = (int)(r1 - m < 4 ? r1 - m : 4);
                tile(xs + m * ldxs, ldxs, mr, panel, KP, KP, n_here, acc);
                epilogue(acc, mr, n_here, m, nb0, N, bias, act, res, ldr, y, out_f32, ldy);
            }
        }
        free(buf);
    }
    free(normed);
}
