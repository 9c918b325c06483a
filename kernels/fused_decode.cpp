#include "fused_decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics start their reductions and conversions from
// _mm512_undefined_ps(), which its own -Wmaybe-uninitialized reports.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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

// A thread's buffers: q's rows (scaled, float32), the block's keys and
// values widened to float32 (16-bit caches), the block's scores.
struct Scratch {
  std::vector<float> q, k, v, s;
  explicit Scratch(const FusedDecodeCall& c)
      : q(static_cast<std::size_t>(c.group * c.rows * c.head_dim)),
        k(static_cast<std::size_t>(kBlockKeys * c.head_dim)),
        v(static_cast<std::size_t>(kBlockKeys * c.value_dim)),
        s(static_cast<std::size_t>(kFusedMaxRows * kBlockKeys)) {}
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
  const float next = std::max(m, top);
  return {next, m == kMinusInf ? 0.0F : std::exp(m - next)};
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

// Row pointers of a block as float32: the cache's own rows, or (16-bit)
// widened into `buf`, one row of `x` elements per key.
template <typename T>
KEEL_AVX512 void block_rows(const CacheRows& side, const Task& t, std::int64_t seq, std::int64_t j0,
                            std::int64_t nk, std::int64_t x, float* buf, const float** out) {
  for (std::int64_t u = 0; u < nk; ++u) {
    const T* src = row_at<T>(side, seq, t.h, j0 + u);
    if constexpr (std::is_same_v<T, float>) {
      out[u] = src;
    } else {
      float* dst = buf + u * x;
      for (std::int64_t e = 0; e < x; e += 16) _mm512_storeu_ps(dst + e, load16(src + e));
      out[u] = dst;
    }
  }
}

// Query rows per step of the products: one load of a key (value) chunk
// serves this many rows, whose sums are independent chains.
constexpr std::int64_t kRowStep = 4;

// Calls f(std::integral_constant<int, n>) for n = rows (1 .. kRowStep).
template <typename F>
void by_rows(std::int64_t rows, F&& f) {
  switch (rows) {
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

// Scores of R query rows (q, R x e_dim) against the block's nk keys, into
// s (R rows of kBlockKeys).
template <int R>
KEEL_AVX512 void row_scores(const float* q, std::int64_t e_dim, const float* const* kf,
                            std::int64_t nk, float* s) {
  for (std::int64_t u = 0; u < nk; ++u) {
    __m512 a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
    for (std::int64_t e = 0; e < e_dim; e += 16) {
      const __m512 kc = _mm512_loadu_ps(kf[u] + e);
      for (int r = 0; r < R; ++r) {
        a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * e_dim + e), kc, a[r]);
      }
    }
    for (int r = 0; r < R; ++r) s[r * kBlockKeys + u] = _mm512_reduce_add_ps(a[r]);
  }
}

// acc (R rows of ev_dim) += p (R rows of kBlockKeys weights) x the block's
// nk value rows.
template <int R>
KEEL_AVX512 void row_values(const float* p, const float* const* vf, std::int64_t nk,
                            std::int64_t ev_dim, float* acc) {
  for (std::int64_t e = 0; e < ev_dim; e += 16) {
    __m512 a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm512_loadu_ps(acc + r * ev_dim + e);
    for (std::int64_t u = 0; u < nk; ++u) {
      const __m512 vc = _mm512_loadu_ps(vf[u] + e);
      for (int r = 0; r < R; ++r) {
        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[r * kBlockKeys + u]), vc, a[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + r * ev_dim + e, a[r]);
  }
}

// Asks for the rows of the block at j0 (its keys and values), a block ahead
// of their use: a block's rows are 16 short runs (a page each, in a paged
// cache), which the hardware prefetcher alone leaves waiting on memory.
template <typename T>
KEEL_AVX512 void prefetch_block(const FusedDecodeCall& c, const Task& t, std::int64_t j0) {
  const std::int64_t nk = std::min(kBlockKeys, t.hi - j0);
  const auto lines = [](const T* row, std::int64_t x) {
    const char* bytes = reinterpret_cast<const char*>(row);
    for (std::int64_t off = 0; off < x * static_cast<std::int64_t>(sizeof(T)); off += 64) {
      _mm_prefetch(bytes + off, _MM_HINT_T0);
    }
  };
  for (std::int64_t u = 0; u < nk; ++u) {
    lines(row_at<T>(c.k, c.c0 + t.b, t.h, j0 + u), c.head_dim);
    lines(row_at<T>(c.v, c.c0 + t.b, t.h, j0 + u), c.value_dim);
  }
}

template <typename T>
KEEL_AVX512 void task_avx512(const FusedDecodeCall& c, const Task& t, Scratch& sc) {
  const std::int64_t rows_m = c.group * c.rows;
  const std::int64_t e_dim = c.head_dim;
  const std::int64_t ev_dim = c.value_dim;
  load_queries<T>(c, t.b, t.h, sc.q.data());
  const float* kf[kBlockKeys];
  const float* vf[kBlockKeys];
  float* s = sc.s.data();
  const __m512 minus_inf = _mm512_set1_ps(kMinusInf);
  for (std::int64_t j0 = t.lo; j0 < t.hi; j0 += kBlockKeys) {
    const std::int64_t nk = std::min(kBlockKeys, t.hi - j0);
    if (j0 + kBlockKeys < t.hi) prefetch_block<T>(c, t, j0 + kBlockKeys);
    block_rows<T>(c.k, t, c.c0 + t.b, j0, nk, e_dim, sc.k.data(), kf);
    block_rows<T>(c.v, t, c.c0 + t.b, j0, nk, ev_dim, sc.v.data(), vf);
    // Scores: every row against every key of the block, four rows at a time.
    for (std::int64_t i = 0; i < rows_m; i += kRowStep) {
      by_rows(std::min(kRowStep, rows_m - i), [&](auto rows) {
        row_scores<decltype(rows)::value>(sc.q.data() + i * e_dim, e_dim, kf, nk,
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
    // at a time.
    for (std::int64_t i = 0; i < rows_m; i += kRowStep) {
      by_rows(std::min(kRowStep, rows_m - i), [&](auto rows) {
        row_values<decltype(rows)::value>(s + i * kBlockKeys, vf, nk, ev_dim, t.acc + i * ev_dim);
      });
    }
  }
}

#endif  // __x86_64__

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Tasks [0, total), claimed one at a time by whoever runs them.
class TaskQueue {
 public:
  explicit TaskQueue(std::int64_t total) : total_(total) {}
  // The next unclaimed task, or -1.
  std::int64_t claim() {
    const std::int64_t t = next_.fetch_add(1);
    return t < total_ ? t : -1;
  }
  void done_one() {
    if (done_.fetch_add(1) + 1 == total_) {
      const std::lock_guard<std::mutex> lock(mu_);
      all_done_.notify_all();
    }
  }
  void fail(std::exception_ptr e) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::move(e);
  }
  // Returns once every task is done (each claimed one is running on a
  // thread that is finishing it); rethrows the first task's exception.
  void wait_all() {
    std::unique_lock<std::mutex> lock(mu_);
    all_done_.wait(lock, [&] { return done_.load() == total_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  const std::int64_t total_;
  std::atomic<std::int64_t> next_{0};
  std::atomic<std::int64_t> done_{0};
  std::mutex mu_;
  std::condition_variable all_done_;
  std::exception_ptr error_;
};

// Runs `body(first, queue)` on the calling thread and on up to
// at::get_num_threads() - 1 helpers from ATen's inter-op pool, each from
// the first task it claimed; body claims the rest and marks each done.
//
// Not at::parallel_for: in libtorch's OpenMP builds that is an inline
// template whose `omp parallel` runs in parallel only in a translation unit
// compiled with -fopenmp (keel's ran on one thread), and a second OpenMP
// runtime beside libtorch's is worse. The caller never waits for a helper
// to start: it claims what is left itself, then waits for the tasks
// helpers claimed, which are running. A helper that starts late claims
// nothing and returns without touching the call's state.
void run_tasks(std::int64_t total, const std::function<void(std::int64_t, TaskQueue&)>& body) {
  const auto queue = std::make_shared<TaskQueue>(total);
  const auto participate = [&body](TaskQueue& q) {
    const std::int64_t first = q.claim();
    if (first < 0) return;
    try {
      body(first, q);
    } catch (...) {
      // Only an allocation can throw; the tasks left are marked done so
      // that the wait ends, and the caller rethrows.
      q.fail(std::current_exception());
      for (std::int64_t t = q.claim(); t >= 0; t = q.claim()) q.done_one();
      q.done_one();
    }
  };
  const std::int64_t helpers =
      at::in_parallel_region() ? 0 : std::min<std::int64_t>(at::get_num_threads(), total) - 1;
  for (std::int64_t h = 0; h < helpers; ++h) {
    at::launch([queue, participate] { participate(*queue); });
  }
  participate(*queue);
  queue->wait_all();
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
    run_tasks(heads * runs, [&](std::int64_t first, TaskQueue& queue) {
      Scratch sc(c);
      for (std::int64_t task = first; task >= 0; task = queue.claim()) {
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
        queue.done_one();
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
