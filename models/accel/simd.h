// 16-float vectors (GCC vector extensions: the compiler lowers them to the machine's own, AVX-512 to SSE2 or
// NEON) and what the compiled kernels share: loads, stores, Cephes' expf and horizontal sums and maxima.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

typedef float vf __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi __attribute__((vector_size(64), aligned(4)));
typedef int64_t i64;

static inline vf ld(const float* p) { return *(const vf*)p; }
static inline void st(float* p, vf x) { *(vf*)p = x; }
static inline vf bc(float a) { return (vf){} + a; }

// Cephes expf, 2^n · p(r) for x = n ln 2 + r, |r| ≤ ln 2 / 2, for x ≤ 0 (scores less their row's maximum or
// log-sum-exp); below −87.3 (exp underflows float32's normal range) it is clamped there. NaN stays NaN.
static inline vf vexp(vf x) {
    x = x < bc(-87.33654f) ? bc(-87.33654f) : x;
    vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = bc(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)e;
}

static inline vf vmax(vf a, vf b) { return a > b ? a : b; }

// Lane l of the result: x[l ^ h] for h = 8, 4, 2, 1 (a butterfly step of a horizontal reduction)
template <int h>
static inline vf swap_lanes(vf x) {
    return __builtin_shuffle(x, (vi){0 ^ h, 1 ^ h, 2 ^ h, 3 ^ h, 4 ^ h, 5 ^ h, 6 ^ h, 7 ^ h, 8 ^ h, 9 ^ h, 10 ^ h,
                                     11 ^ h, 12 ^ h, 13 ^ h, 14 ^ h, 15 ^ h});
}

static inline float hsum(vf x) {
    x += swap_lanes<8>(x);
    x += swap_lanes<4>(x);
    x += swap_lanes<2>(x);
    x += swap_lanes<1>(x);
    return x[0];
}

static inline float hmax(vf x) {
    x = vmax(x, swap_lanes<8>(x));
    x = vmax(x, swap_lanes<4>(x));
    x = vmax(x, swap_lanes<2>(x));
    x = vmax(x, swap_lanes<1>(x));
    return x[0];
}
