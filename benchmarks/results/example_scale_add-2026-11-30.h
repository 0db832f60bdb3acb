#pragma once
//
// scale_add: tuned configs (pick: fastest) exported by `tuner export` (tuner 0.1.0)
// on 2026-11-30 22:14 UTC. Generated: do not edit.
// Figures are medians measured by the study on the GPU named; fractions are of the
// device-to-device copy bandwidth measured on that GPU with the same protocol.
//
// study scale_add-n64M_float32-NVIDIA_H200: NVIDIA H200 (sm_90), problem n64M float32 n=67108864
//   scale_add_vec4_block1024_items1: 4.226 TB/s = 0.991 of the 4.26 TB/s ceiling, median 0.1906 ms;
//     18 registers, 0 B SMEM, 2 blocks/SM; trial 44, measured 2026-11-30
//
// Grid formulas come from tuner.kernels launches(), evaluated on each tuned problem and on each
// size x2 and x3. `select` returns the config tuned for the problem nearest in log space (exact
// match first). A config's source (when embedded) has its tuned problem's sizes compiled in:
// check with `tuned_for` before launching it on another shape.

namespace tuned::scale_add {

struct Dim3 {
    unsigned x, y, z;
#if defined(__CUDACC__)
    operator dim3() const { return dim3(x, y, z); }
#endif
};

constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// Problem sizes, in the family's order.
struct Problem {
    long long n;
};

// The tuned knobs (the study's params).
struct Params {
    long long vec;
    long long block;
    long long items;
};

// Values derived from the params (and the tuned problem) by the search space.
struct Derived {
};

struct Launch {
    const char* entry;            // extern "C" kernel name in the source
    Dim3 block;
    unsigned smem_dynamic_bytes;
};

struct Config {
    const char* uri;              // readable name: the same in logs, caches and the dashboard
    const char* study;
    const char* gpu;              // the GPU it was measured on
    const char* arch;             // e.g. "sm_90"
    const char* problem_name;
    const char* dtype;
    Problem problem;              // the sizes it was tuned for (and its source compiled for)
    Params params;
    Derived derived;
    int threads;                  // threads per block (largest over its launches)
    int registers;                // per thread
    int smem_bytes;               // per block, static + dynamic
    int spill_bytes;
    int blocks_per_sm;            // resident blocks per SM (occupancy) as measured
    double tbps;                  // measured useful bandwidth
    double tflops;
    double fraction_of_ceiling;   // of the device-to-device copy bandwidth on that GPU
    double median_ms;
    int launch_count;
    const Launch* launches;
    Dim3 (*grid_fn)(const Problem& p, int launch);
    const char* source;           // rendered CUDA (nullptr unless exported --with-source)

    constexpr Dim3 grid(const Problem& p, int launch = 0) const { return grid_fn(p, launch); }
    constexpr Dim3 grid(long long n, int launch = 0) const {
        return grid_fn(Problem{n}, launch);
    }
    constexpr bool tuned_for(long long n) const {
        return problem.n == n;
    }
};

// scale_add_vec4_block1024_items1
inline constexpr Launch scale_add_vec4_block1024_items1_launches[] = {
    {"scale_add_vec4_block1024_items1", {1024u, 1u, 1u}, 0u},  // args: x, y, out, alpha, n
};
constexpr Dim3 scale_add_vec4_block1024_items1_grid(const Problem& p, int launch) {
    // launch 0: grid (ceil(n / 4096), 1, 1)
    if (launch == 0) {
        return Dim3{static_cast<unsigned>(ceil_div(p.n, 4096)),
                    1u,
                    1u};
    }
    (void)p;
    return Dim3{0u, 0u, 0u};
}
inline constexpr Config scale_add_vec4_block1024_items1 = {
    "scale_add_vec4_block1024_items1",  // uri
    "scale_add-n64M_float32-NVIDIA_H200",  // study
    "NVIDIA H200",  // gpu
    "sm_90",  // arch
    "n64M",  // problem_name
    "float32",  // dtype
    Problem{67108864},  // problem
    Params{4, 1024, 1},  // params
    Derived{},  // derived
    1024,  // threads
    18,  // registers
    0,  // smem_bytes
    0,  // spill_bytes
    2,  // blocks_per_sm
    4.225999033367384,  // tbps
    0.0,  // tflops
    0.9910578956566821,  // fraction_of_ceiling
    0.1905599981546402,  // median_ms
    1,  // launch_count
    scale_add_vec4_block1024_items1_launches,  // launches
    &scale_add_vec4_block1024_items1_grid,  // grid_fn
    nullptr,  // source
};

// Every exported config; for each study, fastest first.
inline constexpr const Config* configs[] = {
    &scale_add_vec4_block1024_items1,
};
inline constexpr int config_count = 1;

constexpr bool same_text(const char* a, const char* b) {
    while (*a != '\0' && *a == *b) { ++a; ++b; }
    return *a == *b;
}

constexpr double ratio(long long a, long long b) {
    return a <= 0 || b <= 0 ? 1e300 : a > b ? double(a) / double(b) : double(b) / double(a);
}

// Distance of two problems in log space: the product of the max/min ratios of their sizes
// (1.0: the same problem).
constexpr double distance(const Problem& a, const Problem& b) {
    return ratio(a.n, b.n);
}

// The config tuned for the problem nearest to the given sizes (an exact match wins; ties go to the
// earlier, i.e. faster, config) among those tuned on `arch` (e.g. "sm_90"), or on any arch when
// arch is nullptr. nullptr only when no config was tuned on that arch.
constexpr const Config* select(long long n, const char* arch = nullptr) {
    const Problem want{n};
    const Config* best = nullptr;
    double best_distance = 0.0;
    for (const Config* c : configs) {
        if (arch != nullptr && !same_text(c->arch, arch)) continue;
        const double d = distance(c->problem, want);
        if (best == nullptr || d < best_distance) { best = c; best_distance = d; }
    }
    return best;
}

}  // namespace tuned::scale_add
