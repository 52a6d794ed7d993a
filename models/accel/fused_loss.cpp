// Cross-entropy over a vocabulary, float32, forward and backward in one pass over the logits each
// (models/fused_loss.py loads it). For row r of logits x with target t, m = max_j x_j and s = log Σ_j exp(x_j − m):
// loss = (m − x_t) + s, and its gradient g · (softmax(x) − onehot(t)) = g · (exp((x − m) − s) − onehot(t)) (m and s
// kept apart, as log_softmax does: x − m is exact near the maximum, where m + s would round to m's ulp). torch runs the
// same as log_softmax (a [N, V] write), nll_loss's zero-filled [N, V] gradient and log_softmax's backward (two
// reads and a write); here the forward only reads the logits and the backward reads them once and writes the
// gradient once. Rows are spread over OpenMP threads (torch's own: the library shares its runtime).
#include "simd.h"

// exp(x) for x ≤ 0 (logits less their row's maximum), 0 where it underflows float32's normal range (vexp clamps
// there instead: −inf logits get an exact 0, as torch gives them); NaN stays NaN.
static inline vf vexp0(vf x) { return x < bc(-87.33654f) ? bc(0.f) : vexp(x); }

extern "C" {

// x: [N, V] floats, row r at x + r · ldx, V contiguous; t: [N] targets, `ignore` meaning none (its loss is 0).
// Writes each row's m and s [N] and loss [N]. Returns 0, or 1 where a target is neither in [0, V) nor `ignore` (its
// loss NaN).
int fl_forward(const float* x, i64 N, i64 V, i64 ldx, const i64* t, i64 ignore, float* row_max, float* log_sum,
               float* loss, int threads) {
    int bad = 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (i64 r = 0; r < N; ++r) {
        const float* row = x + r * ldx;
        i64 j = 0, V16 = V - V % 16;
        vf m = bc(-INFINITY);
        for (; j < V16; j += 16) m = vmax(m, ld(row + j));
        float mx = hmax(m);
        for (; j < V; ++j) mx = std::max(mx, row[j]);
        vf s = bc(0.f), M = bc(mx);
        for (j = 0; j < V16; j += 16) s += vexp0(ld(row + j) - M);
        float sum = hsum(s);
        for (; j < V; ++j) sum += std::exp(row[j] - mx);
        float ls = std::log(sum);
        row_max[r] = mx;
        log_sum[r] = ls;
        if (t[r] == ignore) {
            loss[r] = 0.f;
        } else if (t[r] >= 0 && t[r] < V) {
            loss[r] = (mx - row[t[r]]) + ls;
        } else {
            loss[r] = NAN;
#pragma omp atomic write
            bad = 1;
        }
    }
    return bad;
}

// dx [N, V] (row r at dx + r · lddx) = g[r · gs] · (exp((x − m) − s) − onehot(t)) for fl_forward's x, t, m and s,
// and the rows' loss gradients g (gs = 0: one for all); rows whose target is `ignore` get 0.
int fl_backward(const float* x, i64 N, i64 V, i64 ldx, const i64* t, i64 ignore, const float* row_max,
                const float* log_sum, const float* g, i64 gs, float* dx, i64 lddx, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (i64 r = 0; r < N; ++r) {
        const float* row = x + r * ldx;
        float* out = dx + r * lddx;
        if (t[r] == ignore) {
            std::memset(out, 0, (size_t)V * sizeof(float));
            continue;
        }
        float gr = g[r * gs], mx = row_max[r], ls = log_sum[r];
        vf M = bc(mx), S = bc(ls), G = bc(gr);
        i64 j = 0, V16 = V - V % 16;
        for (; j < V16; j += 16) st(out + j, vexp0((ld(row + j) - M) - S) * G);
        for (; j < V; ++j) out[j] = std::exp((row[j] - mx) - ls) * gr;
        if (t[r] >= 0 && t[r] < V) out[t[r]] -= gr;
    }
    return 0;
}
}
