/* 3-D neighbourhood attention on the CPU, float32: each query's window read in place, nothing gathered.
 *
 * Semantics: vae/kernels/neighborhood.py (the window shifts inward at the grid's borders, never at a box's).
 * Built at first use by cpu_na.py with this machine's C compiler (-O3 -march=native), loaded with ctypes.
 *
 * Why it is fast: along w, a group of R = 17 - Kw consecutive queries of one row reads keys that all lie
 * in 16 consecutive positions (each query's window is Kw wide, the starts grow by at most 1). So for every
 * key row (t', h') of the group's window the scores of the R queries are R vectors of 16 lanes (a 16-wide
 * slice of the row; lanes outside a query's window masked), computed as R broadcast-FMAs per key channel
 * from the keys laid out channel-major (k_t: B*heads, T, H, D, Wpad): GEMM-like arithmetic on exactly
 * the keys the windows need (11 of 16 lanes at Kw = 11), where a blocked GEMM computes a whole box
 * (44 % useful at 2x4x8 queries) and first copies it. The float32 softmax, then the values (v_r: B*heads, T,
 * H, Wpad, D) weighted 16 channels at a time with the R queries' accumulators in registers.
 *
 * Layouts: q and out B,t,h,w,heads,D at the caller's strides (D contiguous); k_t and v_r as above, zero
 * beyond the key box's width (Wpad = max(W, 16)). D a multiple of 16.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16 /* keys of a row per group; channels per step of the weighted sum */
#if defined(__AVX512F__)
#define VW 16 /* floats per native vector: vectors wider than the machine's are lowered through memory */
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
#define NV (LANES / VW)
/* The most queries a group takes: their scores (R x NV vectors) stay in registers (16 vector registers below
   AVX-512, 32 with it). */
#define RMAX (VW == 16 ? 16 : 12 / NV)
/* Keeps a loaded vector in a register: else the compiler re-reads it from memory for each of its R uses,
   and the loads, not the multiply-adds, bound the loop (measured: 12-17 % of the kernel's time on AVX2). */
#if defined(__AVX512F__)
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) || defined(__i386__)
#define IN_REGISTER(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define IN_REGISTER(v) __asm__("" : "+w"(v))
#else
#define IN_REGISTER(v) (void)0
#endif
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VW * sizeof(float))));

/* The call's geometry: index names as cpu_na.py fills them. */
enum {
    P_B, P_HEADS, P_D, P_TQ, P_HQ, P_WQ, P_TK, P_HK, P_WK, P_WPAD,
    P_QT0, P_QH0, P_QW0, P_KT0, P_KH0, P_KW0, P_GT, P_GH, P_GW, P_KT, P_KH, P_KW,
    P_QSB, P_QST, P_QSH, P_QSW, P_QSN, P_OSB, P_OST, P_OSH, P_OSW, P_OSN, P_COUNT
};

static inline vf load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf select_vf(vi mask, vf yes, vf no) { return (vf)((mask & (vi)yes) | (~mask & (vi)no)); }

/* e^x per lane (Cephes' expf: range reduction by ln 2, degree-6 polynomial; about 1 ulp), x >= -87.3. */
static inline vf exp_vf(vf x) {
    const vf lo = (vf){} - 87.3f, hi = (vf){} + 88.3f;
    x = select_vf(x < lo, lo, select_vf(x > hi, hi, x));
    const vf shifter = (vf){} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to the nearest integer */
    vf n = (x * 1.44269504088896341f + shifter) - shifter;
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = (vf){} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23; /* 2^n */
    return p * (vf)bits;
}

static inline int window_start(int64_t p, int64_t kernel, int64_t length) {
    int64_t s = p - kernel / 2;
    if (s > length - kernel) s = length - kernel;
    return (int)(s < 0 ? 0 : s);
}

static inline float hmax(vf v) { float m = v[0]; for (int i = 1; i < VW; i++) m = v[i] > m ? v[i] : m; return m; }
static inline float hsum(vf v) { float s = 0; for (int i = 0; i < VW; i++) s += v[i]; return s; }

/* One group: R queries (w0, w0 + R) of query row (bh, t, h). `scores` holds R * Kt*Kh * LANES floats. */
static inline __attribute__((always_inline)) void group(const int R, const int64_t *p, const float *q,
                                                        const float *k_t, const float *v_r, float *out, int64_t bh,
                                                        int64_t t, int64_t h, int64_t w0, float scale, float *scores) {
    const int64_t D = p[P_D], heads = p[P_HEADS], wpad = p[P_WPAD], kt = p[P_KT], kh = p[P_KH], kw = p[P_KW];
    const int64_t b = bh / heads, n = bh % heads, rows = kt * kh;
    const int64_t ts = window_start(p[P_QT0] + t, kt, p[P_GT]) - p[P_KT0];
    const int64_t hs = window_start(p[P_QH0] + h, kh, p[P_GH]) - p[P_KH0];
    int64_t ws[LANES];
    for (int r = 0; r < R; r++) ws[r] = window_start(p[P_QW0] + w0 + r, kw, p[P_GW]) - p[P_KW0];
    const int64_t u0 = ws[0] < wpad - LANES ? ws[0] : wpad - LANES; /* the 16 lanes hold every window */
    vi visible[LANES][NV];
    for (int r = 0; r < R; r++)
        for (int l = 0; l < LANES; l++) visible[r][l / VW][l % VW] = (u0 + l >= ws[r] && u0 + l < ws[r] + kw) ? -1 : 0;
    float *queries = scores + R * (rows * LANES + D); /* the R queries, scaled, side by side: R x D */
    for (int r = 0; r < R; r++) {
        const float *qr = q + b * p[P_QSB] + t * p[P_QST] + h * p[P_QSH] + (w0 + r) * p[P_QSW] + n * p[P_QSN];
        for (int64_t d = 0; d < D; d++) queries[r * D + d] = qr[d] * scale;
    }
    const int64_t plane = p[P_HK] * D * wpad; /* one frame of k_t (and of v_r) for one head */
    const float *k_head = k_t + (bh * p[P_TK]) * plane, *v_head = v_r + (bh * p[P_TK]) * plane;

    /* scores: R x rows x LANES, scaled; top: each query's running maximum over its visible lanes */
    vf top[LANES][NV];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NV; j++) top[r][j] = (vf){} - 3.0e38f;
    for (int64_t a = 0; a < kt; a++)
        for (int64_t c = 0; c < kh; c++) {
            const float *keys = k_head + (ts + a) * plane + (hs + c) * D * wpad + u0;
            vf acc[LANES][NV];
            for (int r = 0; r < R; r++)
                for (int j = 0; j < NV; j++) acc[r][j] = (vf){};
            for (int64_t d = 0; d < D; d++) {
                vf key[NV];
                for (int j = 0; j < NV; j++) {
                    key[j] = load(keys + d * wpad + j * VW);
                    IN_REGISTER(key[j]);
                }
                for (int r = 0; r < R; r++) {
                    const float qd = queries[r * D + d];
                    for (int j = 0; j < NV; j++) acc[r][j] += qd * key[j];
                }
            }
            float *row_scores = scores + (a * kh + c) * LANES;
            for (int r = 0; r < R; r++)
                for (int j = 0; j < NV; j++) {
                    vf s = acc[r][j];
                    store(row_scores + r * rows * LANES + j * VW, s);
                    top[r][j] = select_vf(visible[r][j] & (s > top[r][j]), s, top[r][j]);
                }
        }
    /* softmax weights, unnormalised; masked lanes exactly 0 */
    float inv[LANES];
    for (int r = 0; r < R; r++) {
        float m = hmax(top[r][0]);
        for (int j = 1; j < NV; j++) m = hmax(top[r][j]) > m ? hmax(top[r][j]) : m;
        vf total = (vf){};
        for (int64_t row = 0; row < rows; row++)
            for (int j = 0; j < NV; j++) {
                float *s = scores + (r * rows + row) * LANES + j * VW;
                vf e = (vf)((vi)exp_vf(load(s) - m) & visible[r][j]);
                store(s, e);
                total += e;
            }
        inv[r] = 1.0f / hsum(total);
    }
    /* out = weights . values: key row by key row (its values stay in L1 across the channel steps), LANES
       channels at a time, the R queries' sums in `sums` (R x D) between rows */
    float *sums = scores + R * rows * LANES;
    memset(sums, 0, sizeof(float) * R * D);
    for (int64_t a = 0; a < kt; a++)
        for (int64_t c = 0; c < kh; c++) {
            const float *values = v_head + (ts + a) * plane + ((hs + c) * wpad + u0) * D;
            const float *weights = scores + (a * kh + c) * LANES;
            for (int64_t d0 = 0; d0 < D; d0 += LANES) {
                vf acc[LANES][NV];
                for (int r = 0; r < R; r++)
                    for (int j = 0; j < NV; j++) acc[r][j] = load(sums + r * D + d0 + j * VW);
                for (int l = 0; l < LANES; l++) {
                    vf value[NV];
                    for (int j = 0; j < NV; j++) value[j] = load(values + l * D + d0 + j * VW);
                    for (int r = 0; r < R; r++) {
                        const float weight = weights[r * rows * LANES + l];
                        for (int j = 0; j < NV; j++) acc[r][j] += weight * value[j];
                    }
                }
                for (int r = 0; r < R; r++)
                    for (int j = 0; j < NV; j++) store(sums + r * D + d0 + j * VW, acc[r][j]);
            }
        }
    for (int r = 0; r < R; r++) {
        float *o = out + b * p[P_OSB] + t * p[P_OST] + h * p[P_OSH] + (w0 + r) * p[P_OSW] + n * p[P_OSN];
        for (int64_t d0 = 0; d0 < D; d0 += VW) store(o + d0, load(sums + r * D + d0) * inv[r]);
    }
}

/* Any R: the same code with R unknown to the compiler (not unrolled: slower), for the uncommon group sizes. */
static __attribute__((noinline)) void group_any(int R, const int64_t *p, const float *q, const float *k_t,
                                                const float *v_r, float *out, int64_t bh, int64_t t, int64_t h,
                                                int64_t w0, float scale, float *scores) {
    group(R, p, q, k_t, v_r, out, bh, t, h, w0, scale, scores);
}

#define GROUP_CASE(R) case R: group(R, p, q, k_t, v_r, out, bh, t, h, w0, scale, scores); break;
#if RMAX >= 14 /* the group sizes of windows 11, 7, 5 and 3 wide (LTX-2.5's are 11, 7 and 5) */
#define SIZED_CASES GROUP_CASE(6) GROUP_CASE(10) GROUP_CASE(12) GROUP_CASE(14)
#else /* every window up to 17 - RMAX wide */
#define SIZED_CASES GROUP_CASE(RMAX)
#endif

/* Query rows [row_begin, row_end) of B*heads x Tq x Hq (one thread's share). Returns 0, or -1 when out of memory. */
int na3d_f32(const int64_t *p, float scale, const float *q, const float *k_t, const float *v_r, float *out,
             int64_t row_begin, int64_t row_end) {
    const int64_t tq = p[P_TQ], hq = p[P_HQ], wq = p[P_WQ];
    int R = (int)(LANES + 1 - p[P_KW]);
    R = R < RMAX ? R : RMAX;
    R = R < wq ? R : (int)wq;
    float *scores = malloc(sizeof(float) * (size_t)(R * (p[P_KT] * p[P_KH] * LANES + 2 * p[P_D])));
    if (!scores) return -1;
    for (int64_t row = row_begin; row < row_end; row++) {
        const int64_t bh = row / (tq * hq), t = row / hq % tq, h = row % hq;
        for (int64_t w = 0; w < wq; w += R) {
            const int64_t w0 = w + R <= wq ? w : wq - R; /* the last group shifted back to end with the row */
            switch (R) {
                SIZED_CASES
                default: group_any(R, p, q, k_t, v_r, out, bh, t, h, w0, scale, scores);
            }
        }
    }
    free(scores);
    return 0;
}

int na3d_lanes(void) { return LANES; }
int na3d_params(void) { return P_COUNT; }
