// Fused softmax attention for training, float32, forward and backward (models/fused_attention.py loads it).
//
// For each (sequence, head) pair, in its own OpenMP iteration: k and v are transposed into [D, T] columns, q, k, v
// and dz rows are read where they are, and the pair's [T, T] square (scores, pattern, their gradients) lives in
// cache from its first product to its last, instead of passing through memory between batched products. Forward as FlashAttention
// (Dao et al. 2022, Algorithm 1) with one block of keys per pair: S = scale · q kᵀ, P = softmax(S) (causal: keys
// after the query masked), z = P v, and the row's log-sum-exp `lse` kept; backward as its Algorithm 2: P recomputed
// as exp(scale · q kᵀ − lse), dP = dz vᵀ, dS = P ⊙ (dP − rowsum(P ⊙ dP)), dq = scale · dS k, dk = scale · dSᵀ q,
// dv = Pᵀ dz. Products are register-blocked with GCC vector extensions (16 floats; the compiler maps them to the
// machine's vectors) and accumulate in float32; exp is Cephes' expf polynomial (a few ulp).
#include "simd.h"

// Rows a (index bit h clear) and b (bit h set) of a 16 × 16 block with that bit swapped between row and column
// index; the four steps h = 8, 4, 2, 1 transpose the block.
template <int h>
static inline void swap_bit(vf& a, vf& b) {
#define M(l, lo) ((l) & h ? (lo ? 16 + (l) - h : 16 + (l)) : (lo ? (l) : (l) + h))
#define ROW(lo) (vi){M(0, lo), M(1, lo), M(2, lo), M(3, lo), M(4, lo), M(5, lo), M(6, lo), M(7, lo), M(8, lo), \
                     M(9, lo), M(10, lo), M(11, lo), M(12, lo), M(13, lo), M(14, lo), M(15, lo)}
    vf lo = __builtin_shuffle(a, b, ROW(1)), hi = __builtin_shuffle(a, b, ROW(0));
#undef ROW
#undef M
    a = lo;
    b = hi;
}

template <int h>
static inline void swap_bits(vf* x) {
    for (int i = 0; i < 16; ++i)
        if (!(i & h)) swap_bit<h>(x[i], x[i + h]);
}

static const vi LANE = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// C[r][0:16·NV] = alpha · s_r · Σ_{k0 ≤ k < k1} A(r, k) · B[k][0:16·NV] for r < R, stored for r < n; A(r, k) =
// AT ? A[k·lda + r] : A[r·lda + k]; s_r = rows[r], or 1 where rows is null
template <int R, int NV, bool AT>
static inline void block(const float* A, i64 lda, const float* B, i64 ldb, i64 k0, i64 k1, float* C, i64 ldc,
                         float alpha, const float* rows = nullptr, i64 n = R) {
    vf c[R][NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) c[r][v] = bc(0.f);
    for (i64 k = k0; k < k1; ++k) {
        vf b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = ld(B + k * ldb + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            float a = AT ? A[k * lda + r] : A[r * lda + k];
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) c[r][v] += a * b[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        if (r >= n) break;
        float a = rows ? alpha * rows[r] : alpha;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) st(C + r * ldc + 16 * v, c[r][v] * a);
    }
}

// Rows [i0, i0 + 4) of A Bᵀ (A's rows D floats apart by lda, Bᵀ given as Bt [D][Tp]) into C[4][Tp], columns
// [0, ncols) (a multiple of 16)
static void rows_abt(const float* A, i64 lda, i64 D, const float* Bt, i64 Tp, i64 ncols, float* C) {
    i64 j = 0;
    for (; j + 64 <= ncols; j += 64) block<4, 4, false>(A, lda, Bt + j, Tp, 0, D, C + j, Tp, 1.f);
    switch ((ncols - j) / 16) {
        case 3: block<4, 3, false>(A, lda, Bt + j, Tp, 0, D, C + j, Tp, 1.f); break;
        case 2: block<4, 2, false>(A, lda, Bt + j, Tp, 0, D, C + j, Tp, 1.f); break;
        case 1: block<4, 1, false>(A, lda, Bt + j, Tp, 0, D, C + j, Tp, 1.f); break;
        default: break;
    }
}

// Rows i < T of C = alpha · A B (AT false) or alpha · Aᵀ B (AT true), row i also times rows[i] where given, for
// the square A [Tp][Tp] (zero past T) and B's rows k < T (D floats, ldb apart), C's rows ldc apart. Causal: A's
// entries above the diagonal are zero, so row block i0 of A B reads k < i0 + 8 and of Aᵀ B reads k ≥ i0.
template <bool AT>
static void square_times(const float* A, i64 Tp, i64 T, const float* B, i64 ldb, i64 D, float* C, i64 ldc,
                         float alpha, bool causal, const float* rows = nullptr) {
    for (i64 i0 = 0; i0 < T; i0 += 8) {
        i64 k0 = AT && causal ? i0 : 0, k1 = !AT && causal ? std::min(T, i0 + 8) : T, n = T - i0;
        const float *a = AT ? A + i0 : A + i0 * Tp, *a4 = AT ? a + 4 : a + 4 * Tp;
        float *c = C + i0 * ldc, *c4 = c + 4 * ldc;
        const float *s = rows ? rows + i0 : nullptr, *s4 = rows ? rows + i0 + 4 : nullptr;
        switch (D / 16) {
            case 1: block<8, 1, AT>(a, Tp, B, ldb, k0, k1, c, ldc, alpha, s, n); break;
            case 2: block<8, 2, AT>(a, Tp, B, ldb, k0, k1, c, ldc, alpha, s, n); break;
            case 3:
                block<4, 3, AT>(a, Tp, B, ldb, k0, k1, c, ldc, alpha, s, n);
                if (n > 4) block<4, 3, AT>(a4, Tp, B, ldb, k0, k1, c4, ldc, alpha, s4, n - 4);
                break;
            default:
                block<4, 4, AT>(a, Tp, B, ldb, k0, k1, c, ldc, alpha, s, n);
                if (n > 4) block<4, 4, AT>(a4, Tp, B, ldb, k0, k1, c4, ldc, alpha, s4, n - 4);
                break;
        }
    }
}

// A thread's working memory, kept from call to call (OpenMP's threads persist): no allocation, no page faults
// in a step.
struct Scratch {
    float* mem = nullptr;
    size_t size = 0;
    ~Scratch() { free(mem); }
    float* get(size_t bytes) {
        if (bytes > size) {
            free(mem);
            size = (bytes + 63) / 64 * 64;
            mem = (float*)aligned_alloc(64, size);
            if (!mem) size = 0;
        }
        return mem;
    }
};
static thread_local Scratch scratch;

// One pair's working memory: the columns [D][Tp] of its keys and values (transposed: the products' B operands for
// q kᵀ and dz vᵀ), its squares [Tp][Tp] and per-row values, 64-byte aligned. Its rows (q, k, v, dz) are read where
// they are, `stride` floats apart; `q`, `dz` and their strides are set per pair.
struct Pair {
    i64 T, Tp, D, qs = 0, dzs = 0;
    const float *q = nullptr, *dz = nullptr;
    float *kt, *vt, *P, *dS, *dP, *inv, *tail, *mem;
    Pair(i64 T_, i64 D_) : T(T_), Tp((T_ + 15) / 16 * 16), D(D_) {
        mem = scratch.get((size_t)(2 * Tp * D + 2 * Tp * Tp + 5 * Tp + 4 * D) * 4);
        float* p = mem;
        kt = p; p += Tp * D;
        vt = p; p += Tp * D;
        P = p; p += Tp * Tp;
        dS = p; p += Tp * Tp;
        dP = p; p += 4 * Tp;
        inv = p; p += Tp;
        tail = p;
    }
    // The transpose [D][Tp] of the rows t < T of x (x + t·stride, D contiguous floats; zero for t ≥ T), 16 × 16
    // blocks at a time in registers
    void transpose(const float* x, i64 stride, float* cols) const {
        for (i64 t0 = 0; t0 < Tp; t0 += 16)
            for (i64 d0 = 0; d0 < D; d0 += 16) {
                vf b[16];
                for (int i = 0; i < 16; ++i) b[i] = t0 + i < T ? ld(x + (t0 + i) * stride + d0) : bc(0.f);
                swap_bits<8>(b);
                swap_bits<4>(b);
                swap_bits<2>(b);
                swap_bits<1>(b);
                for (int i = 0; i < 16; ++i) st(cols + (d0 + i) * Tp + t0, b[i]);
            }
    }
    // Rows [i0, i0 + 4) of x (stride apart) as an operand: in place, or, where they run past T, copied into `tail`
    // with zero rows after T
    const float* four_rows(const float* x, i64 stride, i64 i0, i64* lda) const {
        *lda = stride;
        if (i0 + 4 <= T) return x + i0 * stride;
        for (i64 r = 0; r < 4; ++r)
            for (i64 d = 0; d < D; ++d) tail[r * D + d] = i0 + r < T ? x[(i0 + r) * stride + d] : 0.f;
        *lda = D;
        return tail;
    }
    i64 cols(i64 i0, bool causal) const { return causal ? std::min(Tp, (i0 + 4 + 15) / 16 * 16) : Tp; }

    // Pattern rows [i0, i0 + 4) into P: exp(scale · q kᵀ − m) with m the row's maximum (writing m and the row's sum
    // Σ to max_out and sum_out, whose log-sum-exp m + log Σ the caller forms, and 1 / Σ to `inv`, by which z's row is
    // scaled: P is left unnormalised) or, given lse, exp(scale · q kᵀ − lse), the softmax itself. Entries a row may
    // not see (causal: keys after it; keys ≥ T; rows ≥ T) are 0.
    void pattern(i64 i0, bool causal, float scale, const float* lse_in, float* max_out, float* sum_out) {
        i64 ncols = cols(i0, causal);
        float* S = P + i0 * Tp;
        i64 lda;
        const float* a = four_rows(q, qs, i0, &lda);
        rows_abt(a, lda, D, kt, Tp, ncols, S);
        for (i64 r = 0; r < 4; ++r) {
            i64 i = i0 + r, seen = i >= T ? 0 : causal ? i + 1 : T, nv = (seen + 15) / 16;
            float* s = S + r * Tp;
            std::memset(s + nv * 16, 0, (size_t)(Tp - nv * 16) * 4);
            if (seen == 0) {  // a row past T: its z is not read, but stays finite
                inv[i] = 0.f;
                continue;
            }
            vi last = LANE < (int32_t)(seen - 16 * (nv - 1));  // the lanes of the last vector a row sees
            float m;
            if (lse_in) {
                m = lse_in[i];
            } else {
                vf mx = last ? ld(s + 16 * (nv - 1)) * scale : bc(-INFINITY);
                for (i64 u = 0; u < nv - 1; ++u) mx = vmax(mx, ld(s + 16 * u) * scale);
                m = hmax(mx);
            }
            vf sum = bc(0.f);
            for (i64 u = 0; u < nv; ++u) {
                vf e = vexp(ld(s + 16 * u) * scale - m);
                if (u == nv - 1) e = last ? e : bc(0.f);
                st(s + 16 * u, e);
                sum += e;
            }
            if (!lse_in) {
                float total = hsum(sum);
                inv[i] = 1.f / total;
                max_out[i] = m;
                sum_out[i] = total;
            }
        }
    }
};

// body(pair, p) for every pair p < pairs, spread over `threads` OpenMP threads (torch's own: the library shares its
// runtime). Returns 0, 1 for shapes the kernel does not take, 2 when memory ran out.
template <class Body>
static int each_pair(i64 pairs, i64 T, i64 D, int threads, Body body) {
    if (!(T > 0 && D > 0 && D % 16 == 0 && D <= 64)) return 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        Pair w(T, D);
        if (!w.mem) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(static)
        for (i64 p = 0; p < pairs; ++p)
            if (w.mem) body(w, p);
    }
    return failed;
}

extern "C" {

// q, k, v: [B, T, H, D] with strides s·[0..2] = (batch, pos, head) in floats, D contiguous. Writes z [B, T, H, D]
// (contiguous) and each row's largest scaled score and sum of exponentials, [B·H, T] each (its log-sum-exp is
// max + log sum: one vectorised log by the caller, where a scalar one per row here took ~8 % of the forward).
// Returns as each_pair.
int fa_forward(const float* q, const float* k, const float* v, const i64* qs, const i64* ks, const i64* vs, i64 B,
               i64 T, i64 H, i64 D, int causal, float scale, float* z, float* row_max, float* row_sum, int threads) {
    return each_pair(B * H, T, D, threads, [&](Pair& w, i64 p) {
        i64 b = p / H, h = p % H;
        w.q = q + b * qs[0] + h * qs[2], w.qs = qs[1];
        w.transpose(k + b * ks[0] + h * ks[2], ks[1], w.kt);
        for (i64 i0 = 0; i0 < w.Tp; i0 += 4) w.pattern(i0, causal, scale, nullptr, row_max + p * T, row_sum + p * T);
        square_times<false>(w.P, w.Tp, T, v + b * vs[0] + h * vs[2], vs[1], D, z + (b * T * H + h) * D, H * D, 1.f,
                            causal, w.inv);
    });
}

// The gradients of fa_forward's z: dz [B, T, H, D] with strides dzs; lse from fa_forward; dq, dk, dv [B, T, H, D]
// (null: not wanted) with strides gs[0..2], gs[3..5], gs[6..8] (batch, pos, head; D contiguous). Returns as each_pair.
int fa_backward(const float* q, const float* k, const float* v, const i64* qs, const i64* ks, const i64* vs,
                const float* dz, const i64* dzs, i64 B, i64 T, i64 H, i64 D, int causal, float scale,
                const float* lse, float* dq, float* dk, float* dv, const i64* gs, int threads) {
    return each_pair(B * H, T, D, threads, [&](Pair& w, i64 p) {
        i64 b = p / H, h = p % H, Tp = w.Tp;
        const float *qp = q + b * qs[0] + h * qs[2], *kp = k + b * ks[0] + h * ks[2];
        w.q = qp, w.qs = qs[1], w.dz = dz + b * dzs[0] + h * dzs[2], w.dzs = dzs[1];
        w.transpose(kp, ks[1], w.kt);
        w.transpose(v + b * vs[0] + h * vs[2], vs[1], w.vt);
        for (i64 i0 = 0; i0 < Tp; i0 += 4) {
            w.pattern(i0, causal, scale, lse + p * T, nullptr, nullptr);
            i64 ncols = w.cols(i0, causal), nv = ncols / 16, lda;
            const float* a = w.four_rows(w.dz, w.dzs, i0, &lda);
            rows_abt(a, lda, D, w.vt, Tp, ncols, w.dP);
            for (i64 r = 0; r < 4; ++r) {
                const float *P = w.P + (i0 + r) * Tp, *g = w.dP + r * Tp;
                float* dS = w.dS + (i0 + r) * Tp;
                vf acc = bc(0.f);
                for (i64 u = 0; u < nv; ++u) acc += ld(P + 16 * u) * ld(g + 16 * u);
                float Di = hsum(acc);
                for (i64 u = 0; u < nv; ++u) st(dS + 16 * u, ld(P + 16 * u) * (ld(g + 16 * u) - Di));
                std::memset(dS + ncols, 0, (size_t)(Tp - ncols) * 4);
            }
        }
        if (dq) square_times<false>(w.dS, Tp, T, kp, ks[1], D, dq + b * gs[0] + h * gs[2], gs[1], scale, causal);
        if (dk) square_times<true>(w.dS, Tp, T, qp, qs[1], D, dk + b * gs[3] + h * gs[5], gs[4], scale, causal);
        if (dv) square_times<true>(w.P, Tp, T, w.dz, w.dzs, D, dv + b * gs[6] + h * gs[8], gs[7], 1.f, causal);
    });
}
}
