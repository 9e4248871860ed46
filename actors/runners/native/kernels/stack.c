#include "common.h"

/* sy_stack: every layer of a plain decoder in one call, so a step crosses from Python once, not
 * five times a layer (at one row a call's crossing and its Python cost about as much as a small
 * layer's work). Each layer is exactly the calls rowwise.py makes one by one, with the same
 * arguments, so the bits are the same:
 *   qkv  = RMSNorm(h, input_norm) W_qkv^T (+ b)              sy_linear
 *   (Qwen3: each head of q and k through its RMSNorm)       as sy_rmsnorm, in place
 *   attn = attention of rotary(q) over the cache, k, v in   sy_rope_attention
 *   h   += attn W_o^T                                        sy_linear (residual)
 *   mlp  = silu(gate) * up of RMSNorm(h, post_norm) W_gu^T   sy_linear (a SwiGLU pair)
 *   h   += mlp W_down^T                                      sy_linear (residual)
 * `layers` holds STACK_FIELDS int64 a layer (ops.py `Stack` writes them): the norms', weights',
 * biases' and cache's addresses, each matrix's format and width, the q and k norms' (or 0). */
#define STACK_FIELDS 22

void sy_linear(const bf16 *x, int64_t M, int64_t K, int64_t ldx, const bf16 *norm, float eps, const uint8_t *w, int fmt, int64_t N,
               const float *bias, int act, const bf16 *res, int64_t ldr, void *y, int out_f32, int64_t ldy, int threads);
void sy_rope_attention(const bf16 *qkv, int64_t T, int64_t ld, int H, int KVH, int D, const float *cos, const float *sin, const int64_t *pos,
                       const int64_t *slots, bf16 *kc, bf16 *vc, int64_t S, const int32_t *tables, int64_t tstride, int bs, const int32_t *row_seq,
                       int window, float scale, bf16 *out, int threads);

#define P(i) ((void *)(intptr_t)f[i])

/* RMSNorm over each `D`-wide head of `heads` starting at `offset` in every row of qkv, in place
 * (rmsnorm_row reads its whole row before it writes): the rows `ops.rmsnorm` would make. */
static void head_norms(bf16 *qkv, int64_t T, int64_t ld, int64_t offset, int heads, int D, const bf16 *w, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (T * heads > 1)
    for (int64_t r = 0; r < T * heads; r++) {
        bf16 *row = qkv + (r / heads) * ld + offset + (r % heads) * D;
        rmsnorm_row(row, D, w, eps, row);
    }
}

void sy_stack(bf16 *h, int64_t T, int64_t D, int L, const int64_t *layers, float eps, int H, int KVH, int HD, const float *cos, const float *sin,
              const int64_t *pos, const int64_t *slots, int64_t S, const int32_t *tables, int64_t tstride, int bs, const int32_t *row_seq, int window,
              float scale, bf16 *qkv, bf16 *attn, bf16 *mlp, int threads) {
    int64_t Q = (int64_t)H * HD;
    for (int l = 0; l < L; l++) {
        const int64_t *f = layers + (int64_t)l * STACK_FIELDS;
        int64_t n_qkv = f[3], n_gu = f[12], inter = f[12] / 2;
        sy_linear(h, T, D, D, P(0), eps, P(1), (int)f[2], n_qkv, P(4), 0, NULL, n_qkv, qkv, 0, n_qkv, threads);
        if (f[20]) {
            head_norms(qkv, T, n_qkv, 0, H, HD, P(20), eps, threads);
            head_norms(qkv, T, n_qkv, Q, KVH, HD, P(21), eps, threads);
        }
        sy_rope_attention(qkv, T, n_qkv, H, KVH, HD, cos, sin, pos, slots, P(18), P(19), S, tables, tstride, bs, row_seq, window, scale, attn, threads);
        sy_linear(attn, T, Q, Q, NULL, eps, P(5), (int)f[6], f[7], P(8), 0, h, D, h, 0, D, threads);
        sy_linear(h, T, D, D, P(9), eps, P(10), (int)f[11], n_gu, P(13), 1, NULL, inter, mlp, 0, inter, threads);
        sy_linear(mlp, T, inter, inter, NULL, eps, P(14), (int)f[15], f[16], P(17), 0, h, D, h, 0, D, threads);
    }
}
