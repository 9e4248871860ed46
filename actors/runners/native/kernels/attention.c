#include "common.h"

/* q . k over D (D % 16 == 0): lane l sums pairs (32c + 2l, 32c + 2l + 1), odd first, over c;
 * a last half chunk (D % 32 == 16) adds zeros past its end. */
static inline float dot(const bf16 *q, const bf16 *k, int D) {
#ifdef __AVX512BF16__
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < D; c += 32) {
        __mmask32 m = D - c >= 32 ? 0xFFFFFFFFu : 0xFFFFu;
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m, q + c), (__m512bh)_mm512_maskz_loadu_epi16(m, k + c));
    }
    return tree_sum(acc);
#else
    float lanes[16] = {0};
    for (int c = 0; c < D; c += 32)
        for (int l = 0; l < 16; l++) {
            float q1 = c + 2 * l + 1 < D ? bf16_f32(q[c + 2 * l + 1]) : 0.0f, k1 = c + 2 * l + 1 < D ? bf16_f32(k[c + 2 * l + 1]) : 0.0f;
            float q0 = c + 2 * l < D ? bf16_f32(q[c + 2 * l]) : 0.0f, k0 = c + 2 * l < D ? bf16_f32(k[c + 2 * l]) : 0.0f;
            lanes[l] += q1 * k1;
            lanes[l] += q0 * k0;
        }
    return tree_sum16(lanes);
#endif
}

#ifdef __AVX512BF16__
/* The dot products of q with 16 keys at once: each key's 16 lane sums reduced in tree_sum's
 * order (lanes i + 8, then + 4, + 2, + 1), four shuffle-and-add rounds across the 16 vectors
 * instead of one tree each: the same sums, bit for bit. */
static inline __m512 hsum16(__m512 v[16]) {
    __m512 s1[8], s2[4], s3[2];
    for (int i = 0; i < 8; i++)
        s1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        s2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], 0x88), _mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        s3[i] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * i], s2[2 * i + 1], 0x44), _mm512_shuffle_ps(s2[2 * i], s2[2 * i + 1], 0xEE));
    __m512 s4 = _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88), _mm512_shuffle_ps(s3[0], s3[1], 0xDD));
    /* s4 holds keys in the order 0 4 8 12 | 1 5 9 13 | 2 6 10 14 | 3 7 11 15 */
    static const int order[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    return _mm512_permutexvar_ps(_mm512_loadu_si512(order), s4);
}
#endif

/* s[jj] = q . k[slots[jj]] * scale for jj < n. */
static void scores(const bf16 *q, const bf16 *kbase, const int64_t *slots, int64_t n, int D, float scale, float *s) {
    int64_t jj = 0;
#ifdef __AVX512BF16__
    __m512i qv[8];
    int chunks = (D + 31) / 32;
    for (int c = 0; c < chunks; c++) qv[c] = _mm512_maskz_loadu_epi16(D - 32 * c >= 32 ? 0xFFFFFFFFu : 0xFFFFu, q + 32 * c);
    for (; D <= 256 && jj + 16 <= n; jj += 16) {
        __m512 part[16];
        for (int k = 0; k < 16; k++) {
            const bf16 *key = kbase + slots[jj + k] * D;
            __m512 acc = _mm512_setzero_ps();
            for (int c = 0; c < chunks; c++) {
                __mmask32 m = D - 32 * c >= 32 ? 0xFFFFFFFFu : 0xFFFFu;
                acc = _mm512_dpbf16_ps(acc, (__m512bh)qv[c], (__m512bh)_mm512_maskz_loadu_epi16(m, key + 32 * c));
            }
            part[k] = acc;
        }
        _mm512_storeu_ps(s + jj, _mm512_mul_ps(hsum16(part), _mm512_set1_ps(scale)));
    }
#endif
    for (; jj < n; jj++) s[jj] = dot(q, kbase + slots[jj] * D, D) * scale;
}

/* p[i] = exp(s[i] - max) for i < n, in place; their sum (lane i % 16, then the tree). */
static float softmax_numerators(float *s, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    float lanes[16] = {0};
    for (int64_t i = 0; i < n; i += 16) {
        int w = (int)(n - i < 16 ? n - i : 16);
#ifdef __AVX512BF16__
        __mmask16 k = (__mmask16)((1u << w) - 1);
        __m512 e = exp_vec(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), _mm512_set1_ps(mx)));
        _mm512_mask_storeu_ps(s + i, k, e);
        _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_loadu_ps(lanes), _mm512_maskz_mov_ps(k, e)));
#else
        for (int l = 0; l < w; l++) {
            s[i + l] = exp_one(s[i + l] - mx);
            lanes[l] += s[i + l];
        }
#endif
    }
    return tree_sum16(lanes);
}

/* o[g] = sum over keys jj < n of p[g][jj] v[slot jj], g < gb, in key order; then dst[g] = bf16(o[g] / sum). */
static inline __attribute__((always_inline)) void weigh_values(
    const int DC, const int GB, const float *sc, int64_t sstride, const int64_t *slots, int64_t n, const bf16 *vbase, const float *inv, bf16 *dst) {
#ifdef __AVX512BF16__
    __m512 o[4][16];
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < DC; c++) o[g][c] = _mm512_setzero_ps();
    for (int64_t jj = 0; jj < n; jj++) {
        const bf16 *v = vbase + slots[jj] * DC * 16;
        __m512 vv[16];
        for (int c = 0; c < DC; c++)
            vv[c] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v + 16 * c))), 16));
        for (int g = 0; g < GB; g++) {
            __m512 p = _mm512_set1_ps(sc[g * sstride + jj]);
            for (int c = 0; c < DC; c++) o[g][c] = _mm512_fmadd_ps(p, vv[c], o[g][c]);
        }
    }
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < DC; c++)
            _mm256_storeu_si256((__m256i *)(dst + (g * DC + c) * 16), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(o[g][c], _mm512_set1_ps(inv[g]))));
#else
    float o[4][256];
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < DC * 16; c++) o[g][c] = 0.0f;
    for (int64_t jj = 0; jj < n; jj++) {
        const bf16 *v = vbase + slots[jj] * DC * 16;
        for (int g = 0; g < GB; g++)
            for (int c = 0; c < DC * 16; c++) o[g][c] = fmaf(sc[g * sstride + jj], bf16_f32(v[c]), o[g][c]);
    }
    for (int g = 0; g < GB; g++)
        for (int c = 0; c < DC * 16; c++) dst[g * DC * 16 + c] = f32_bf16(o[g][c] * inv[g]);
#endif
}

/* The heads of one kv head a pass at a time: as many as keep their sums in 16 registers. */
static int heads_per_pass(int DC) { return DC >= 16 ? 1 : DC >= 8 ? 2 : 4; }

static void weigh_dispatch(int DC, int GB, const float *sc, int64_t sstride, const int64_t *slots, int64_t n, const bf16 *vbase, const float *inv, bf16 *dst) {
#define W(DC_, GB_) weigh_values(DC_, GB_, sc, sstride, slots, n, vbase, inv, dst)
#define HEADS(DC_) switch (GB) { case 1: W(DC_, 1); break; case 2: W(DC_, 2); break; case 3: W(DC_, 3); break; default: W(DC_, 4); break; }
    switch (DC) {
    case 1: HEADS(1); break;
    case 2: HEADS(2); break;
    case 4: HEADS(4); break;
    case 6: HEADS(6); break;
    case 8: if (GB == 1) W(8, 1); else W(8, 2); break;
    case 16: W(16, 1); break;
    default: abort(); /* the model path checks head_dim before it uses these kernels */
    }
#undef HEADS
#undef W
}

/* out[t, h] = softmax(q[t, h] . K / sqrt) V over row t's keys: those of sequence row_seq[t] at
 * positions (pos - window, pos] (window 0: all of 0..pos), found through its block table in the
 * cache [KVH, S, D]. One task per (row, kv head), its query heads together; D / 16 one of 1,
 * 2, 4, 6, 8, 16. Every sum runs in key order (values: per head, in lanes of 16 dimensions). */
void sy_attention(const bf16 *q, int64_t T, int H, int KVH, int D, const bf16 *kc, const bf16 *vc, int64_t S,
                  const int32_t *tables, int64_t tstride, int bs, const int32_t *row_seq, const int32_t *row_pos,
                  int window, float scale, bf16 *out, int threads) {
    int G = H / KVH;
    int64_t longest = 1;
    for (int64_t t = 0; t < T; t++) longest = row_pos[t] + 1 > longest ? row_pos[t] + 1 : longest;
    int64_t sstride = longest + 16;
#pragma omp parallel num_threads(threads)
    {
        float *sc = (float *)malloc(sizeof(float) * (size_t)G * (size_t)sstride);
        int64_t *slots = (int64_t *)malloc(sizeof(int64_t) * (size_t)sstride);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < T * KVH; task++) {
            int64_t t = task / KVH, kvh = task % KVH, L = (int64_t)row_pos[t] + 1;
            int64_t start = window > 0 && L > window ? L - window : 0, n = L - start;
            const int32_t *table = tables + (int64_t)row_seq[t] * tstride;
            for (int64_t j = start; j < L;) { /* a block table entry at a time */
                int64_t base = (int64_t)table[j / bs] * bs, off = j % bs;
                for (; off < bs && j < L; off++, j++) slots[j - start] = base + off;
            }
            const bf16 *kbase = kc + kvh * S * D, *vbase = vc + kvh * S * D;
            float inv[64];
            for (int g = 0; g < G; g++) {
                const bf16 *qg = q + (t * H + kvh * G + g) * D;
                float *s = sc + (int64_t)g * sstride;
                scores(qg, kbase, slots, n, D, scale, s);
                inv[g] = 1.0f / softmax_numerators(s, n);
            }
            int per_pass = heads_per_pass(D / 16);
            for (int g0 = 0; g0 < G; g0 += per_pass) {
                int gb = G - g0 < per_pass ? G - g0 : per_pass;
                weigh_dispatch(D / 16, gb, sc + (int64_t)g0 * sstride, sstride, slots, n, vbase, inv + g0, out + (t * H + kvh * G + g0) * D);
            }
        }
        free(sc);
        free(slots);
    }
}
