#include "fused_decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <c10/util/BFloat16.h>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start their reductions and conversions from
// _mm512_undefined_ps(), which its own -W(maybe-)uninitialized reports.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
// The AVX-512 path is compiled for AVX-512 whatever the build's target, and
// runs only where the CPU reports it (fused_decode_runs_here).
#define KEEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#endif

namespace keel::kernels {

namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
// Keys per block: one AVX-512 register of scores per query row.
constexpr std::int64_t kBlockKeys = 16;
// The fewest keys a run of keys (one task) covers: below this the merge of
// runs costs more than the threads it keeps busy gain.
constexpr std::int64_t kMinRunKeys = 256;

template <typename T>
const T* row_at(const CacheRows& s, std::int64_t seq, std::int64_t h, std::int64_t j) {
  const T* base = static_cast<const T*>(s.base);
  if (s.pages != nullptr) {
    return base + s.pages[j / s.page_size] * s.outer_stride + h * s.head_stride +
           (j % s.page_size) * s.row_stride;
  }
  return base + seq * s.outer_stride + h * s.head_stride + j * s.row_stride;
}

// One task: kv head h of sequence b (of the call), keys [lo, hi).
struct Task {
  std::int64_t b = 0, h = 0, lo = 0, hi = 0;
  float* acc = nullptr;  // [M, Ev], unnormalised
  float* m = nullptr;    // [M], the running maximum score
  float* l = nullptr;    // [M], the sum of exp(score - m)
};

// A thread's buffers: q's rows (scaled, float32), the block's scores, and
// a row of zeros that stands in for the keys past the end of a short block.
struct Scratch {
  std::vector<float> q, s, zeros;
  explicit Scratch(const FusedDecodeCall& c)
      : q(static_cast<std::size_t>(c.group * c.rows * c.head_dim)),
        s(static_cast<std::size_t>(kFusedMaxRows * kBlockKeys)),
        zeros(static_cast<std::size_t>(c.head_dim), 0.0F) {}
};

// q's rows of kv head h of sequence b, times the scale, as float32 [M, E].
template <typename T>
void load_queries(const FusedDecodeCall& c, std::int64_t b, std::int64_t h, float* dst) {
  const T* q = static_cast<const T*>(c.q);
  const std::int64_t* st = c.q_strides;
  for (std::int64_t gi = 0; gi < c.group; ++gi) {
    for (std::int64_t r = 0; r < c.rows; ++r) {
      const T* src = q + (c.b0 + b) * st[0] + (h * c.group + gi) * st[1] + (c.q0 + r) * st[2];
      float* out = dst + (gi * c.rows + r) * c.head_dim;
      for (std::int64_t e = 0; e < c.head_dim; ++e) {
        out[e] = static_cast<float>(src[e * st[3]]) * c.scale;
      }
    }
  }
}

#if defined(__x86_64__)

// The lanes of a block at j0 of nk keys that row r sees.
std::uint32_t visible_lanes(const FusedDecodeCall& c, std::int64_t r, std::int64_t j0,
                            std::int64_t nk) {
  const std::int64_t first = std::max<std::int64_t>(c.lo[r] - j0, 0);
  const std::int64_t end = std::min<std::int64_t>(c.hi[r] - j0, nk);
  if (end <= first) return 0;
  // end <= nk <= kBlockKeys (16): the shifts stay inside 32 bits.
  return ((1U << end) - 1U) & ~((1U << first) - 1U);
}

// The running maximum of a row after a block whose highest score is `top`,
// and the factor that rescales what the row accumulated before.
struct Rescale {
  float m;
  float alpha;
};
Rescale rescale(float m, float top) {
  if (top <= m) return {m, 1.0F};
  return {top, m == kMinusInf ? 0.0F : std::exp(m - top)};
}

// bfloat16 is the top half of a float32.
KEEL_AVX512 inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// exp(x) for x <= 0 (a score minus its row's maximum), to about 1 ulp:
// Cephes' expf polynomial on x - n ln 2, scaled by 2^n; 0 below -87.3
// (where float32's normal range ends) and for -inf.
KEEL_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 floor = _mm512_set1_ps(-87.3F);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, floor, _CMP_LT_OQ);
  x = _mm512_max_ps(x, floor);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341F)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375F), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4F), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4F);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3F));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3F));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2F));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1F));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1F));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0F));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(y, n));
}

// 16 float32 elements of a row (the bfloat16 overload is above), so that the
// products are written once for both dtypes.
KEEL_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}

// Lane u of the result is the sum of the lanes of v[u]: a tree of 15
// shuffle-and-add steps, against 16 separate reductions.
KEEL_AVX512 inline __m512 reduce16(const __m512* v) {
  __m512 w[8];
  for (std::int64_t i = 0; i < 8; ++i) {  // 256-bit halves: w[i] holds v[2i] and v[2i+1]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 z[4];
  for (std::int64_t i = 0; i < 4; ++i) {  // 128-bit lane j of z[i]: four partial sums of v[4i + j]
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(z[2], z[3]), _mm512_unpackhi_ps(z[2], z[3]));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
  // Lane 4j + i of sums holds v[4i + j].
  return _mm512_permutexvar_ps(
      _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), sums);
}

// Query rows per step of the products: one load of a key (value) chunk
// serves this many rows.
constexpr std::int64_t kRowStep = 4;
// Value chunks (of 16) per step of the weighted sum: kRowStep x this many
// accumulators stay in registers while the block's value rows stream by.
constexpr std::int64_t kChunkStep = 4;

// Calls f(std::integral_constant<int, n>) for n = min(count, 4) (count >= 1).
template <typename F>
void by_count(std::int64_t count, F&& f) {
  switch (count) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

// Query rows per tree of row_scores: R rounded up to 1, 2 or 4.
constexpr std::int64_t rows_per_tree(int rows) {
  return rows == 3 ? 4 : rows;
}

// Scores of R query rows (q, R x e_dim) against the block's 16 key rows
// (kr; rows past the block's end point at zeros), into s (R rows of
// kBlockKeys): 16 / R keys at a time (R rounded up to 1, 2 or 4), whose
// 16 dot products reduce in one tree.
template <int R, typename T>
KEEL_AVX512 void row_scores(const float* q, std::int64_t e_dim, const T* const* kr, float* s) {
  constexpr std::int64_t kKeys = 16 / rows_per_tree(R);
  for (std::int64_t u0 = 0; u0 < kBlockKeys; u0 += kKeys) {
    __m512 a[16];  // a[kKeys * r + k]: row r, key u0 + k
    for (__m512& x : a) x = _mm512_setzero_ps();
    for (std::int64_t e = 0; e < e_dim; e += 16) {
      __m512 kc[kKeys];
      for (std::int64_t k = 0; k < kKeys; ++k) kc[k] = load16(kr[u0 + k] + e);
      for (std::int64_t r = 0; r < R; ++r) {
        const __m512 qc = _mm512_loadu_ps(q + r * e_dim + e);
        for (std::int64_t k = 0; k < kKeys; ++k) {
          a[kKeys * r + k] = _mm512_fmadd_ps(qc, kc[k], a[kKeys * r + k]);
        }
      }
    }
    alignas(64) float sums[16];  // lane kKeys * r + k: row r, key u0 + k
    _mm512_store_ps(sums, reduce16(a));
    for (std::int64_t r = 0; r < R; ++r) {
      std::memcpy(s + r * kBlockKeys + u0, sums + kKeys * r, sizeof(float) * kKeys);
    }
  }
}

// The next block's rows, asked for a few lines at a time while this block's
// values are summed.
template <typename T>
struct Ahead {
  const T* k[kBlockKeys];
  const T* v[kBlockKeys];
  std::int64_t n = 0;  // rows in the next block
  std::int64_t e_dim = 0;
};

// Asks for the cache lines of row[from, to).
template <typename T>
KEEL_AVX512 inline void prefetch_lines(const T* row, std::int64_t from, std::int64_t to) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (std::int64_t off = from * static_cast<std::int64_t>(sizeof(T));
       off < to * static_cast<std::int64_t>(sizeof(T)); off += 64) {
    _mm_prefetch(bytes + off, _MM_HINT_T0);
  }
}

// acc (R rows of ev_dim, columns [e0, e0 + 16 C)) += p (R rows of
// kBlockKeys weights) x the block's nk value rows: R x C accumulators in
// registers, each value chunk loaded once for the R rows. `ahead`, where
// given, asks for the next block's key and value rows meanwhile, a few
// lines per row, so that the reads are spread over the block's arithmetic
// (all at once, they stall it).
template <int R, int C, typename T>
KEEL_AVX512 void row_values(const float* p, const T* const* vr, std::int64_t nk,
                            std::int64_t ev_dim, std::int64_t e0, float* acc,
                            const Ahead<T>* ahead) {
  __m512 a[R * C];
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t ch = 0; ch < C; ++ch)
      a[r * C + ch] = _mm512_loadu_ps(acc + r * ev_dim + e0 + 16 * ch);
  }
  for (std::int64_t u = 0; u < nk; ++u) {
    if (ahead != nullptr && u < ahead->n) {
      // Key row u whole (with the first columns of the values), then value
      // row u's columns of this step.
      if (e0 == 0) prefetch_lines(ahead->k[u], 0, ahead->e_dim);
      prefetch_lines(ahead->v[u], e0, e0 + std::int64_t{16} * C);
    }
    __m512 vc[C];
    for (std::int64_t ch = 0; ch < C; ++ch) vc[ch] = load16(vr[u] + e0 + 16 * ch);
    for (std::int64_t r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * kBlockKeys + u]);
      for (std::int64_t ch = 0; ch < C; ++ch)
        a[r * C + ch] = _mm512_fmadd_ps(w, vc[ch], a[r * C + ch]);
    }
  }
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t ch = 0; ch < C; ++ch)
      _mm512_storeu_ps(acc + r * ev_dim + e0 + 16 * ch, a[r * C + ch]);
  }
}

template <typename T>
KEEL_AVX512 void task_avx512(const FusedDecodeCall& c, const Task& t, Scratch& sc) {
  const std::int64_t rows_m = c.group * c.rows;
  const std::int64_t e_dim = c.head_dim;
  const std::int64_t ev_dim = c.value_dim;
  const std::int64_t seq = c.c0 + t.b;
  load_queries<T>(c, t.b, t.h, sc.q.data());
  const T* zeros = reinterpret_cast<const T*>(sc.zeros.data());
  const T* kr[kBlockKeys];
  const T* vr[kBlockKeys];
  // The rows of the block at j: each block's rows are found once, as the
  // block ahead of the one before it.
  Ahead<T> ahead;
  ahead.e_dim = e_dim;
  const auto find_rows = [&](std::int64_t j) {
    ahead.n = std::clamp<std::int64_t>(t.hi - j, 0, kBlockKeys);
    for (std::int64_t u = 0; u < ahead.n; ++u) {
      ahead.k[u] = row_at<T>(c.k, seq, t.h, j + u);
      ahead.v[u] = row_at<T>(c.v, seq, t.h, j + u);
    }
  };
  find_rows(t.lo);
  float* s = sc.s.data();
  const __m512 minus_inf = _mm512_set1_ps(kMinusInf);
  for (std::int64_t j0 = t.lo; j0 < t.hi; j0 += kBlockKeys) {
    const std::int64_t nk = ahead.n;
    for (std::int64_t u = 0; u < kBlockKeys; ++u) {
      kr[u] = u < nk ? ahead.k[u] : zeros;
      vr[u] = u < nk ? ahead.v[u] : zeros;
    }
    find_rows(j0 + kBlockKeys);
    // Scores: every row against every key of the block, four rows at a time.
    for (std::int64_t i = 0; i < rows_m; i += kRowStep) {
      by_count(rows_m - i, [&](auto rows) {
        row_scores<decltype(rows)::value, T>(sc.q.data() + i * e_dim, e_dim, kr,
                                             s + i * kBlockKeys);
      });
    }
    // Online softmax, a row at a time: s becomes the row's weights.
    for (std::int64_t i = 0; i < rows_m; ++i) {
      const auto lanes = static_cast<__mmask16>(visible_lanes(c, i % c.rows, j0, nk));
      if (lanes == 0) {
        _mm512_storeu_ps(s + i * kBlockKeys, _mm512_setzero_ps());
        continue;
      }
      const __m512 sv = _mm512_mask_loadu_ps(minus_inf, lanes, s + i * kBlockKeys);
      const Rescale rs = rescale(t.m[i], _mm512_mask_reduce_max_ps(lanes, sv));
      const __m512 pv = _mm512_maskz_mov_ps(lanes, exp16(_mm512_sub_ps(sv, _mm512_set1_ps(rs.m))));
      _mm512_storeu_ps(s + i * kBlockKeys, pv);
      t.l[i] = t.l[i] * rs.alpha + _mm512_reduce_add_ps(pv);
      t.m[i] = rs.m;
      if (rs.alpha != 1.0F) {
        float* acc = t.acc + i * ev_dim;
        const __m512 alpha = _mm512_set1_ps(rs.alpha);
        for (std::int64_t e = 0; e < ev_dim; e += 16) {
          _mm512_storeu_ps(acc + e, _mm512_mul_ps(_mm512_loadu_ps(acc + e), alpha));
        }
      }
    }
    // Values: each row's weights times the block's value rows, four rows
    // by four chunks of 16 columns at a time; the first rows' pass asks for
    // the next block's rows.
    for (std::int64_t i = 0; i < rows_m; i += kRowStep) {
      for (std::int64_t e0 = 0; e0 < ev_dim; e0 += 16 * kChunkStep) {
        by_count(rows_m - i, [&](auto rows) {
          by_count((ev_dim - e0) / 16, [&](auto chunks) {
            row_values<decltype(rows)::value, decltype(chunks)::value, T>(
                s + i * kBlockKeys, vr, nk, ev_dim, e0, t.acc + i * ev_dim,
                i == 0 ? &ahead : nullptr);
          });
        });
      }
    }
  }
}

#endif  // __x86_64__

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Tasks [0, total), handed out one at a time to whichever thread asks.
class TaskQueue {
 public:
  explicit TaskQueue(std::int64_t total) : total_(total) {}
  // The next unclaimed task, or -1.
  std::int64_t claim() {
    const std::int64_t t = next_.fetch_add(1);
    return t < total_ ? t : -1;
  }

 private:
  const std::int64_t total_;
  std::atomic<std::int64_t> next_{0};
};

// Runs worker(queue) on the calling thread and on up to
// at::get_num_threads() - 1 more of libtorch's intra-op threads; each
// worker claims tasks until none is left (ragged sequences make tasks of
// different lengths). Returns when every worker has returned, and rethrows
// the first exception one threw.
//
// The threads are libtorch's own OpenMP team, reached through
// TensorIterator::for_each, which is compiled into libtorch: keel's
// at::parallel_for would run on one thread, since in libtorch's OpenMP
// builds it is an inline template whose `omp parallel` runs in parallel only
// in a translation unit compiled with -fopenmp. Helpers from ATen's
// inter-op pool lost to libtorch's kernels at two threads: they competed
// for the core with the OpenMP worker that libtorch's last parallel op left
// spinning. Inside a parallel region, the caller runs every task itself.
void run_tasks(std::int64_t total, const std::function<void(TaskQueue&)>& worker) {
  TaskQueue queue(total);
  const std::int64_t threads =
      at::in_parallel_region() ? 1 : std::min<std::int64_t>(at::get_num_threads(), total);
  if (threads <= 1) {
    worker(queue);
    return;
  }
  // One element per thread, grain 1: for_each's parallel_for hands each
  // thread of the team one element, whose loop runs a worker.
  const at::Tensor one_per_thread = at::empty({threads}, at::kByte);
  at::TensorIterator seats = at::TensorIteratorConfig()
                                 .add_output(one_per_thread)
                                 .resize_outputs(false)
                                 .check_all_same_dtype(false)
                                 .build();
  seats.for_each(
      [&](char** /*data*/, const std::int64_t* /*strides*/, std::int64_t n, std::int64_t m) {
        for (std::int64_t i = 0; i < n * m; ++i) worker(queue);
      },
      1);
}

}  // namespace

bool fused_decode_runs_here(std::int64_t head_dim, std::int64_t value_dim) {
#if defined(__x86_64__)
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512bw") != 0 &&
      __builtin_cpu_supports("avx512dq") != 0 && __builtin_cpu_supports("avx512vl") != 0;
  return avx512 && head_dim > 0 && value_dim > 0 && head_dim % 16 == 0 && value_dim % 16 == 0;
#else
  (void)head_dim;
  (void)value_dim;
  return false;
#endif
}

void fused_decode(const FusedDecodeCall& c) {
  const std::int64_t rows_m = c.group * c.rows;
  if (rows_m > kFusedMaxRows || !fused_decode_runs_here(c.head_dim, c.value_dim) ||
      (c.dtype != c10::ScalarType::Float && c.dtype != c10::ScalarType::BFloat16)) {
    throw std::invalid_argument("fused_decode: a call outside what the kernel serves");
  }
  // The hull of the rows' visible keys.
  std::int64_t lo = std::numeric_limits<std::int64_t>::max();
  std::int64_t hi = 0;
  for (std::int64_t r = 0; r < c.rows; ++r) {
    if (c.hi[r] <= c.lo[r]) continue;
    lo = std::min(lo, c.lo[r]);
    hi = std::max(hi, c.hi[r]);
  }
  const std::int64_t heads = c.nb * c.kv_heads;
  const std::int64_t len = hi > lo ? hi - lo : 0;
  // Runs of keys per kv head: enough tasks for every thread (four each,
  // for balance), never runs shorter than kMinRunKeys.
  const std::int64_t threads = at::get_num_threads();
  std::int64_t runs = std::clamp<std::int64_t>(ceil_div(4 * threads, heads), 1,
                                               std::max<std::int64_t>(1, len / kMinRunKeys));
  const std::int64_t run_len =
      ceil_div(ceil_div(std::max<std::int64_t>(len, 1), runs), kBlockKeys) * kBlockKeys;
  runs = std::max<std::int64_t>(1, ceil_div(len, run_len));
  const std::int64_t ev = c.value_dim;
  std::vector<float> acc(static_cast<std::size_t>(heads * runs * rows_m * ev), 0.0F);
  std::vector<float> m(static_cast<std::size_t>(heads * runs * rows_m), kMinusInf);
  std::vector<float> l(static_cast<std::size_t>(heads * runs * rows_m), 0.0F);
  if (len > 0) {
    run_tasks(heads * runs, [&](TaskQueue& queue) {
      Scratch sc(c);
      for (std::int64_t task = queue.claim(); task >= 0; task = queue.claim()) {
        const std::int64_t head = task / runs;
        const std::int64_t run = task % runs;
        Task t;
        t.b = head / c.kv_heads;
        t.h = head % c.kv_heads;
        t.lo = lo + run * run_len;
        t.hi = std::min(hi, t.lo + run_len);
        t.acc = acc.data() + task * rows_m * ev;
        t.m = m.data() + task * rows_m;
        t.l = l.data() + task * rows_m;
#if defined(__x86_64__)
        if (c.dtype == c10::ScalarType::Float) {
          task_avx512<float>(c, t, sc);
        } else {
          task_avx512<c10::BFloat16>(c, t, sc);
        }
#endif
      }
    });
  }
  // Merge each head's runs by log-sum-exp.
  for (std::int64_t head = 0; head < heads; ++head) {
    for (std::int64_t i = 0; i < rows_m; ++i) {
      float top = kMinusInf;
      for (std::int64_t run = 0; run < runs; ++run) {
        top = std::max(top, m[static_cast<std::size_t>((head * runs + run) * rows_m + i)]);
      }
      float* out = c.out + (head * rows_m + i) * ev;
      std::fill(out, out + ev, 0.0F);
      float sum = 0;
      if (top != kMinusInf) {
        for (std::int64_t run = 0; run < runs; ++run) {
          const std::int64_t at_run = (head * runs + run) * rows_m + i;
          const float mr = m[static_cast<std::size_t>(at_run)];
          if (mr == kMinusInf) continue;
          const float w = std::exp(mr - top);
          sum += l[static_cast<std::size_t>(at_run)] * w;
          const float* part = acc.data() + at_run * ev;
          for (std::int64_t e = 0; e < ev; ++e) out[e] += part[e] * w;
        }
        for (std::int64_t e = 0; e < ev; ++e) out[e] /= sum;
      }
      c.lse[head * rows_m + i] = top == kMinusInf ? kMinusInf : top + std::log(sum);
    }
  }
}

}  // namespace keel::kernels
