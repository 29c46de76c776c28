/* Chen et al.'s learned metric g over every (query, reference) pair on the CPU, the MLP fused per pair.
 *
 * Compiled on first use by bench/losses/pair_kernel.py (cc -O3 -march=native) and called through ctypes;
 * where no compiler is at hand dmlbench scores by LearnedMetric.tile instead (same g up to rounding).
 * Pairs go in blocks of BLK references, hidden unit first, held in vector registers through every layer:
 * the torch tiles write each 10-wide layer to memory and back, and their tiny matrix products are
 * latency-bound. Two hidden units are computed at once so that enough independent accumulator chains
 * keep the FMA units busy. The output is the logit difference z (g = sigmoid(z)); the caller applies it.
 *
 * Layouts (float32, row-major): reference-side inputs are transposed, (features x mp), mp a multiple of BLK
 * zero-padded, so that a block is BLK contiguous floats; outputs are (n x m).
 */
#include <string.h>
#define BLK 64
#define HMAX 64
typedef float vf __attribute__((vector_size(64)));
typedef int vi __attribute__((vector_size(64)));
typedef float vfu __attribute__((vector_size(64), aligned(4)));
#define NV (BLK / 16)

static inline vf relu(vf a) { vf zero = {0}; return (vf)((vi)a & (a > zero)); }
static inline vf absv(vf a) { vi m = {0}; m += 0x7fffffff; return (vf)((vi)a & m); }
static inline vf ld(const float *p) { return *(const vfu *)p; }
static inline vf bc(float s) { vf z = {0}; return z + s; }

/* The hidden layers of one block: act (h x BLK, after the first layer's ReLU) in, z out; tmp is scratch. */
static void head(int h, int L, const float *restrict Ws, const float *restrict bs, const float *restrict v, float c,
                 vf (*act)[NV], vf (*tmp)[NV], vf *z) {
    for (int l = 0; l < L; l++) {
        const float *W = Ws + (long)l * h * h, *b = bs + (long)l * h;
        int o = 0;
        for (; o + 1 < h; o += 2) {  /* two units at once: eight independent accumulator chains */
            vf a0[NV], a1[NV];
            for (int q = 0; q < NV; q++) { a0[q] = bc(b[o]); a1[q] = bc(b[o + 1]); }
            for (int k = 0; k < h; k++) {
                float w0 = W[o * h + k], w1 = W[(o + 1) * h + k];
                for (int q = 0; q < NV; q++) { a0[q] += w0 * act[k][q]; a1[q] += w1 * act[k][q]; }
            }
            for (int q = 0; q < NV; q++) { tmp[o][q] = relu(a0[q]); tmp[o + 1][q] = relu(a1[q]); }
        }
        for (; o < h; o++) {
            vf acc[NV];
            for (int q = 0; q < NV; q++) acc[q] = bc(b[o]);
            for (int k = 0; k < h; k++) { float w = W[o * h + k]; for (int q = 0; q < NV; q++) acc[q] += w * act[k][q]; }
            for (int q = 0; q < NV; q++) tmp[o][q] = relu(acc[q]);
        }
        vf (*s)[NV] = act; act = tmp; tmp = s;
    }
    for (int q = 0; q < NV; q++) z[q] = bc(c);
    for (int k = 0; k < h; k++) for (int q = 0; q < NV; q++) z[q] += v[k] * act[k][q];
}

/* concat: A1 = x W1^T + b, A2 = x W2^T (n x h); B1T = (y W1^T + b)^T, B2T = (y W2^T)^T (h x mp).
 * zf: h([x_i; y_j]), zb: h([y_j; x_i]), the two directions the caller symmetrises. */
void g_concat(int n, int m, int mp, int h, int L, const float *A1, const float *A2, const float *B1T, const float *B2T,
              const float *Ws, const float *bs, const float *v, float c, float *zf, float *zb) {
    vf a1[HMAX][NV], a2[HMAX][NV], z[NV];
    for (int j0 = 0; j0 < m; j0 += BLK)
        for (int i = 0; i < n; i++) {
            int bl = m - j0 < BLK ? m - j0 : BLK;
            for (int k = 0; k < h; k++) { float a = A1[i * h + k]; const float *r = B2T + (long)k * mp + j0;
                for (int q = 0; q < NV; q++) a1[k][q] = relu(a + ld(r + 16 * q)); }
            head(h, L, Ws, bs, v, c, a1, a2, z);
            memcpy(zf + (long)i * m + j0, z, sizeof(float) * bl);
            for (int k = 0; k < h; k++) { float a = A2[i * h + k]; const float *r = B1T + (long)k * mp + j0;
                for (int q = 0; q < NV; q++) a1[k][q] = relu(a + ld(r + 16 * q)); }
            head(h, L, Ws, bs, v, c, a1, a2, z);
            memcpy(zb + (long)i * m + j0, z, sizeof(float) * bl);
        }
}

/* difference_product: x (n x d), yT (d x mp); W1 (h x d) weighs |x - y|, P (n x h x d) = x_i * W2[k]
 * (the product part a bilinear form per unit), b0 the first layer's bias. zo: (n x m). */
void g_dp(int n, int m, int mp, int d, int h, int L, const float *x, const float *yT, const float *W1, const float *P,
          const float *b0, const float *Ws, const float *bs, const float *v, float c, float *zo) {
    vf a1[HMAX][NV], a2[HMAX][NV], z[NV];
    vf diff[d][NV];
    for (int j0 = 0; j0 < m; j0 += BLK)
        for (int i = 0; i < n; i++) {
            int bl = m - j0 < BLK ? m - j0 : BLK;
            for (int cc = 0; cc < d; cc++) { float xi = x[(long)i * d + cc]; const float *r = yT + (long)cc * mp + j0;
                for (int q = 0; q < NV; q++) diff[cc][q] = absv(xi - ld(r + 16 * q)); }
            int k = 0;
            for (; k + 1 < h; k += 2) {  /* two units, |x - y| and product parts apart: sixteen chains */
                vf d0[NV], d1[NV], p0[NV], p1[NV];
                const float *w0 = W1 + (long)k * d, *w1 = w0 + d, *q0 = P + ((long)i * h + k) * d, *q1 = q0 + d;
                for (int q = 0; q < NV; q++) { d0[q] = bc(b0[k]); d1[q] = bc(b0[k + 1]); p0[q] = bc(0.f); p1[q] = bc(0.f); }
                for (int cc = 0; cc < d; cc++) {
                    const float *r = yT + (long)cc * mp + j0;
                    for (int q = 0; q < NV; q++) {
                        vf y = ld(r + 16 * q), df = diff[cc][q];
                        d0[q] += w0[cc] * df; d1[q] += w1[cc] * df; p0[q] += q0[cc] * y; p1[q] += q1[cc] * y;
                    }
                }
                for (int q = 0; q < NV; q++) { a1[k][q] = relu(d0[q] + p0[q]); a1[k + 1][q] = relu(d1[q] + p1[q]); }
            }
            for (; k < h; k++) {
                vf acc[NV];
                const float *w = W1 + (long)k * d, *p = P + ((long)i * h + k) * d;
                for (int q = 0; q < NV; q++) acc[q] = bc(b0[k]);
                for (int cc = 0; cc < d; cc++) { const float *r = yT + (long)cc * mp + j0; float wc = w[cc], pc = p[cc];
                    for (int q = 0; q < NV; q++) acc[q] += wc * diff[cc][q] + pc * ld(r + 16 * q); }
                for (int q = 0; q < NV; q++) a1[k][q] = relu(acc[q]);
            }
            head(h, L, Ws, bs, v, c, a1, a2, z);
            memcpy(zo + (long)i * m + j0, z, sizeof(float) * bl);
        }
}
