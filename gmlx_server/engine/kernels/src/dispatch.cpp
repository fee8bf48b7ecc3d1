// Run-time ISA choice (cpuid, for every kernel: the matmuls and the fp32 attention and activation kernels),
// the worker pool and the matmul driver. Platform calls are guarded: cpuid on x86-64 only, CPU affinity on
// Linux only, dlsym where there is a dynamic loader (Linux, macOS).
#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define GK_DLSYM 1
#endif
#if defined(GK_X86_KERNELS)
#include <cpuid.h>  // GCC's and Clang's
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "formats.h"
#include "kernels.h"
#include "repack.h"
#include "simd.h"  // GK_X86, cpu_relax

namespace gk {

const Isa& isa_generic();
#if defined(GK_X86_KERNELS)  // CMakeLists.txt compiles isa_avx2/avxvnni/avx512vnni.cpp on x86-64
const Isa& isa_avx2();
const Isa& isa_avxvnni();
const Isa& isa_avx512vnni();
#endif

namespace {

using base::cpu_relax;

#if defined(GK_X86_KERNELS)
// What isa_*.cpp need, read with cpuid itself (Clang's __builtin_cpu_supports lacks "f16c" and "avxvnni"
// before version 16), and whether the OS saves the ymm/zmm registers (XCR0).
struct X86Isas {
  bool avx2 = false, avxvnni = false, avx512vnni = false, amd = false;
};

X86Isas x86_isas() {
  unsigned a, b, c, d;
  X86Isas out;
  if (__get_cpuid(0, &a, &b, &c, &d)) out.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return out;  // no cpuid leaf 1, or no OSXSAVE
  const bool fma = c & (1u << 12), avx = c & (1u << 28), f16c = c & (1u << 29);
  unsigned lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const bool ymm = (lo & 0x6) == 0x6, zmm = (lo & 0xE6) == 0xE6;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return out;
  out.avx2 = avx && ymm && fma && f16c && (b & (1u << 5));
  const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));  // F DQ BW VL
  out.avx512vnni = out.avx2 && zmm && avx512 && (c & (1u << 11));
  out.avxvnni = out.avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
  return out;
}
#endif

std::vector<const Isa*> supported_isas() {
  std::vector<const Isa*> out;
#if defined(GK_X86_KERNELS)
  const X86Isas x86 = x86_isas();
  // AVX-512 first: its int16 path takes a whole 32-element group per vpdpwssd (Q8_0 ~1.2x, the rest even)
  if (x86.avx512vnni) out.push_back(&isa_avx512vnni());
  if (x86.avxvnni) out.push_back(&isa_avxvnni());
  if (x86.avx2) out.push_back(&isa_avx2());
#endif
  out.push_back(&isa_generic());
  return out;
}

std::atomic<const Isa*> g_isa{nullptr};

bool halved_zmm(const Isa& s) {
#if defined(GK_X86_KERNELS)
  static const bool amd = x86_isas().amd;
  return amd && &s == &isa_avx512vnni();
#else
  (void)s;
  return false;
#endif
}

const Isa& isa() {
  const Isa* p = g_isa.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = supported_isas().front();
    g_isa.store(p, std::memory_order_release);
  }
  return *p;
}

int usable_cores() {
#if defined(__linux__)  // the cores this process may run on (taskset, cgroups' cpusets)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// Workers spin briefly between calls (a decode step issues hundreds of matmuls tens of microseconds
// apart), then sleep so an idle engine costs no CPU. A run is done when its tasks are, not when every
// worker has checked in: on a busy machine a descheduled worker must not stall the caller, who takes
// the remaining tasks itself. One atomic word holds (generation, task count, next task) so a late
// worker can never claim a task of a run other than the one it saw.
class Pool {
 public:
  explicit Pool(int total) {
    for (int i = 1; i < total; ++i) threads_.emplace_back([this] { worker(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return static_cast<int>(threads_.size()) + 1; }

  void run(int64_t tasks, const std::function<void(int64_t)>& fn) {
    // One run at a time: the run's state is shared with the workers. Another caller meanwhile (a second model's
    // engine evaluating on its own stream) runs its tasks on its own thread; two interleaved runs spun forever.
    std::unique_lock<std::mutex> mine(run_mu_, std::try_to_lock);
    if (!mine.owns_lock() || threads_.empty() || tasks <= 1) {
      for (int64_t i = 0; i < tasks; ++i) fn(i);
      return;
    }
    if (tasks > kMaxTasks) throw std::invalid_argument("pool: too many tasks");
    fn_ = &fn;
    done_.store(0, std::memory_order_relaxed);
    gen_ = gen_ % kGenMask + 1;  // 1..65535: a new worker has seen generation 0
    bool wake;
    {
      std::lock_guard<std::mutex> lk(mu_);
      state_.store((gen_ << 48) | (static_cast<uint64_t>(tasks) << 24), std::memory_order_release);
      wake = sleeping_ > 0;
    }
    if (wake) cv_.notify_all();
    claim(gen_);
    for (int spins = 0; done_.load(std::memory_order_acquire) < tasks; ++spins) {
      if (spins < 64) cpu_relax(); else std::this_thread::yield();  // a worker was descheduled mid-task
    }
  }

 private:
  static constexpr uint64_t kGenMask = 0xFFFF, kField = 0xFFFFFF;
  static constexpr int64_t kMaxTasks = 0xFFFFFF;

  // Take and run tasks of generation `gen` until none is left.
  void claim(uint64_t gen) {
    uint64_t v = state_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t next = v & kField, total = (v >> 24) & kField;
      if ((v >> 48) != gen || next >= total) return;
      if (!state_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      (*fn_)(static_cast<int64_t>(next));
      done_.fetch_add(1, std::memory_order_acq_rel);
      v = state_.load(std::memory_order_acquire);
    }
  }

  void worker() {
    uint64_t seen = 0;  // generation 0 is never run
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      uint64_t gen;
      for (int spins = 0; (gen = state_.load(std::memory_order_acquire) >> 48) == seen; ++spins) {
        // yield now and then: on a core shared with the caller (a busy machine) spinning would starve it
        if ((spins & 15) == 15) std::this_thread::yield(); else cpu_relax();
        if ((spins & 127) == 127 && std::chrono::steady_clock::now() - start > std::chrono::microseconds(200)) {
          std::unique_lock<std::mutex> lk(mu_);
          ++sleeping_;
          cv_.wait(lk, [&] { return stop_ || (state_.load(std::memory_order_acquire) >> 48) != seen; });
          --sleeping_;
          if (stop_) return;
        }
      }
      seen = gen;
      claim(gen);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_mu_;  // held by the one caller whose run the workers serve
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  uint64_t gen_ = 0;  // the caller's copy (only the caller writes state_'s generation)
  const std::function<void(int64_t)>* fn_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  int sleeping_ = 0;
  bool stop_ = false;
};

std::mutex g_pool_mu;
std::unique_ptr<Pool> g_pool;
int g_threads = 0;  // 0: not chosen yet
std::atomic<bool> g_sgemm_ok{true};
enum Mode { kInt16 = 0, kInt8 = 1, kF32 = 2, kAuto = 3 };
const char* const kModeNames[] = {"int16", "int8", "f32", "auto"};
std::atomic<int> g_mode{kAuto};

// auto: the most activation rows at which the int16 kernels (qdot.h) beat the fp32 ones for a format,
// measured one thread, L3-resident weights (bench/kernel_speed.py) on AVX-512 VNNI: the 4-bit 32-blocks'
// fp32 decode is cheap (a table lookup per 16 weights), the 5/6/8-bit ones' and the K-quants' is not.
// An ISA may raise it for every format (Isa::int16_rows).
// AMD's AVX-512 (Zen 4) runs a 512-bit op as two 256-bit halves, which costs the fp32 path's table lookups more:
// there Q4_0/Q4_1's int16 kernels were 1.4-1.5x at 3 rows and 1.1-1.2x at 4, Q8_0's 1.1-1.2x at 8.
int64_t int16_rows(int type, bool halved_zmm) {
  switch (type) {
    case 2: case 3: return halved_zmm ? 4 : 2;  // Q4_0, Q4_1: 1.5x at 1 row, 0.8x at 8
    case 8: return halved_zmm ? 8 : 4;          // Q8_0
    case 7: case 12: return 4;                  // Q5_1, Q4_K: 1.1-1.2x at 4, even at 8
    case 6: return 8;                    // Q5_0: 1.1x at 8
    default: return 1 << 30;             // Q5_K, Q6_K: 1.3-1.8x up to the sgemm rows; the repacked types
                                         // (read as stored by the int16 kernels alone)
  }
}

Pool& pool() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) {
    if (g_threads <= 0) g_threads = usable_cores();
    g_pool = std::make_unique<Pool>(g_threads);
  }
  return *g_pool;
}

}  // namespace

int64_t row_bytes(int type, int64_t k) { return base::row_bytes(type, k); }

const Isa& active_isa() { return isa(); }

const char* isa_name() { return isa().name; }

std::vector<std::string> isa_names() {
  std::vector<std::string> out;
  for (const Isa* p : supported_isas()) out.emplace_back(p->name);
  return out;
}

void set_isa(const std::string& name) {
  for (const Isa* p : supported_isas()) {
    if (name == p->name) {
      g_isa.store(p, std::memory_order_release);
      return;
    }
  }
  throw std::invalid_argument("kernel ISA '" + name + "' is not supported on this CPU");
}

int threads() { return pool().size(); }

void set_threads(int n) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  g_threads = n > 0 ? n : usable_cores();
  g_pool.reset();
}

namespace {

// Rows of `type` as the kernels that read blocks in their file's order see them (fp32 and int8 activations,
// dequantizing): a repacked type's unpacked back into `scratch`, as Q4_K or Q6_K; the others' as they are.
struct Rows {
  int type;
  const uint8_t* w;
};
Rows natural_rows(int type, const uint8_t* w, int64_t rb, int64_t rows, std::vector<uint8_t>& scratch) {
  const int natural = base::natural_type(type);
  if (natural == type) return {type, w};
  scratch.resize(static_cast<size_t>(rows * rb));
  const auto unrepack = type == kQ4KR ? unrepack_q4k : type == kQ5KR ? unrepack_q5k : unrepack_q6k;
  unrepack(w, scratch.data(), rows * rb / base::block_bytes(type));
  return {natural, scratch.data()};
}

const uint8_t* repack_order(int type) {
  return type == kQ4KR ? kQ4KROrder.at : type == kQ5KR ? kQ5KROrder.at : type == kQ6KR ? kQ6KROrder.at : nullptr;
}

// x's (m, k) columns in a repacked type's order (each 256-block's position p takes element order[p]), in a buffer
// of the caller's thread; x itself for the other types
const float* kernel_order(Pool& p, int type, const float* x, int64_t m, int64_t k) {
  const uint8_t* order = repack_order(type);
  if (order == nullptr) return x;
  thread_local std::vector<float> permuted;
  permuted.resize(static_cast<size_t>(m * k));
  float* out = permuted.data();
  p.run(p.size(), [&](int64_t t) {
    for (int64_t i = t; i < m; i += p.size())
      for (int64_t b = 0; b < k; b += 256)
        for (int q = 0; q < 256; ++q) out[i * k + b + q] = x[i * k + b + order[q]];
  });
  return out;
}

// cblas_sgemm of an optimized BLAS already loaded into the global namespace (gmlx preloads OpenBLAS);
// null when there is none, e.g. only the mlx-cpu wheel's private reference BLAS.
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
Sgemm global_sgemm() {
#if defined(GK_DLSYM)
  static const Sgemm fn = reinterpret_cast<Sgemm>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  return fn;
#else
  return nullptr;
#endif
}

// From this many activation rows on, dequantizing panels of W into sgemm beats the fp32 tiles (which
// decode every block again per 4 activation rows): tiles 1.6-2.4x ahead at 16 rows, even at 64 (Q4
// formats ahead, Q5_0/Q6_K behind), sgemm 1.1-2.4x ahead at 512.
constexpr int64_t kSgemmRows = 48;
// Panels of W up to 8 MB of floats: each sgemm call repacks x, so fewer, larger calls (on 512 rows,
// 256-row panels ran at 0.8x dense sgemm, 8 MB ones at 0.97-1.0x; 32 MB ones at 0.93-0.97x).
int64_t panel_rows(int64_t n, int64_t k) { return std::min(n, std::max<int64_t>(256, (8 << 20) / (4 * k))); }

void matmul_sgemm(Sgemm sgemm, int type, const uint8_t* w, int64_t rb, int64_t n, int64_t k, const float* x,
                  int64_t m, float* y) {
  const Isa& s = isa();
  Pool& p = pool();
  thread_local std::vector<float> scratch;  // a thread_local named in a lambda is the running thread's own
  x = kernel_order(p, type, x, m, k);  // a repacked type's panels come in its kernels' order
  const int64_t prows = panel_rows(n, k);
  scratch.resize(static_cast<size_t>(prows * k));
  float* panel = scratch.data();
  for (int64_t n0 = 0; n0 < n; n0 += prows) {
    const int64_t rows = std::min(prows, n - n0);
    const int64_t per = (rows + p.size() - 1) / p.size();
    p.run(p.size(), [&](int64_t t) {
      for (int64_t r = t * per; r < std::min(rows, (t + 1) * per); ++r)
        s.dequant_row(type, w + (n0 + r) * rb, k, panel + r * k);
    });
    // y[:, n0:n0+rows] = x (m, k) @ panel^T (k, rows): row-major, no-trans x trans, ldc n
    sgemm(101, 111, 112, static_cast<int>(m), static_cast<int>(rows), static_cast<int>(k), 1.0f, x,
          static_cast<int>(k), panel, static_cast<int>(k), 0.0f, y + n0, static_cast<int>(n));
  }
}

// Quantize the m activation rows (in parallel when many), then run the weight-row chunks on them.
template <class Block, class Quantize, class Rows>
void run_quantized(Pool& p, const float* x, int64_t m, int64_t k, Quantize quantize, Rows rows, int64_t per,
                   int64_t chunks, int64_t n) {
  const int64_t nxb = k / 32;
  thread_local std::vector<Block> scratch;  // a thread_local named in a lambda is the running thread's own
  if (static_cast<int64_t>(scratch.size()) < m * nxb) scratch.resize(m * nxb);
  Block* xb = scratch.data();
  const int64_t qtasks = m >= 8 ? p.size() : 1;
  p.run(qtasks, [&](int64_t t) {
    for (int64_t i = t; i < m; i += qtasks) quantize(x + i * k, k, xb + i * nxb);
  });
  p.run(chunks, [&](int64_t c) {
    const int64_t n0 = c * per;
    rows(xb, n0, std::min(n, n0 + per));
  });
}

// m activation rows to int16 (one scale per 32, or per 256 for the K-quants; codes up to `full`), with zero
// rows after them up to `rows`, into the calling thread's buffers.
XRows quantize_rows(Pool& p, const Isa& s, int type, const float* x, int64_t m, int64_t rows, int64_t k, int full) {
  const int natural = base::natural_type(type);
  const int group = natural == 12 || natural == 13 || natural == 14 ? 256 : 32;  // Q4_K, Q5_K, Q6_K
  thread_local std::vector<int16_t> codes;  // the caller's own (a thread_local named in a lambda is the runner's)
  thread_local std::vector<float> scales;
  if (static_cast<int64_t>(codes.size()) < rows * k) codes.resize(rows * k);
  if (static_cast<int64_t>(scales.size()) < 2 * rows * (k / 32)) scales.resize(2 * rows * (k / 32));
  const XRows xr{codes.data(), scales.data(), scales.data() + rows * (k / 32), k};
  const uint8_t* order = repack_order(type);
  const int64_t qtasks = m >= 8 ? p.size() : 1;
  p.run(qtasks, [&](int64_t t) {
    for (int64_t i = t; i < m; i += qtasks) s.quantize_q16(x + i * k, k, group, order, i, xr, full);
  });
  std::fill(codes.begin() + m * k, codes.begin() + rows * k, 0);
  std::fill(xr.d + m * (k / group), xr.d + rows * (k / group), 0.0f);
  std::fill(xr.s + m * (k / 32), xr.s + rows * (k / 32), 0.0f);
  return xr;
}

// Activations to int16 once, then the weight-row chunks.
void run_q16(Pool& p, const Isa& s, int type, const uint8_t* w, int64_t rb, int64_t n, int64_t k, const float* x,
             int64_t m, float* y, int64_t per, int64_t chunks) {
  const XRows xr = quantize_rows(p, s, type, x, m, m, k, kRowsFull);
  p.run(chunks, [&](int64_t c) {
    const int64_t n0 = c * per;
    s.rows_q16(type, w, rb, n0, std::min(n, n0 + per), xr, m, y, n);
  });
}

// Many rows against a repacked K-quant or a 32-block format (Isa::gemm_q16): the codes interleaved tile by tile
// (Isa::gemm_tile), then chunks of whole 32-row panels.
void run_gemm16(Pool& p, const Isa& s, int type, const uint8_t* w, int64_t rb, int64_t n, int64_t k, const float* x,
                int64_t m, float* y) {
  const int64_t g = s.gemm_tile, tiles = (m + g - 1) / g, pairs = k / 2;
  const XRows xr = quantize_rows(p, s, type, x, m, tiles * g, k, kGemmFull);
  thread_local std::vector<int32_t> tiled;
  if (static_cast<int64_t>(tiled.size()) < tiles * g * pairs) tiled.resize(tiles * g * pairs);
  const int32_t* from = reinterpret_cast<const int32_t*>(xr.q);
  int32_t* to = tiled.data();
  p.run(p.size(), [&](int64_t t0) {
    for (int64_t t = t0; t < tiles; t += p.size())
      for (int64_t c = 0; c < g; ++c)
        for (int64_t i = 0; i < pairs; ++i) to[(t * pairs + i) * g + c] = from[(t * g + c) * pairs + i];
  });
  const XRows xt{reinterpret_cast<int16_t*>(to), xr.d, xr.s, k};
  const int64_t per = (n + 4 * p.size() * 32 - 1) / (4 * p.size() * 32) * 32;  // whole 32-row panels
  p.run((n + per - 1) / per,
        [&](int64_t c) { s.gemm_q16(type, w, rb, c * per, std::min(n, c * per + per), xt, m, y, n); });
}

}  // namespace

void matmul(int type, const uint8_t* w, int64_t n, int64_t k, const float* x, int64_t m, float* y) {
  const int64_t rb = row_bytes(type, k);
  if (rb <= 0) throw std::invalid_argument("gguf matmul: unsupported type or row length");
  const Isa& s = isa();
  Pool& p = pool();
  int mode = g_mode.load(std::memory_order_relaxed);
  if (m >= kGemmRows && s.gemm_q16 != nullptr && base::gemm16_reads(type) && (mode == kAuto || mode == kInt16))
    return run_gemm16(p, s, type, w, rb, n, k, x, m, y);
  if (m >= kSgemmRows && g_sgemm_ok.load(std::memory_order_relaxed) && global_sgemm() != nullptr)
    return matmul_sgemm(global_sgemm(), type, w, rb, n, k, x, m, y);
  // Enough chunks to balance cores that other processes also use; each a whole number of rows.
  const int64_t per = (std::max<int64_t>(4, (n + 4 * p.size() - 1) / (4 * p.size())) + 3) / 4 * 4;  // whole tiles
  const int64_t chunks = (n + per - 1) / per;
  if (mode == kAuto) mode = m <= std::max<int64_t>(int16_rows(type, halved_zmm(s)), s.int16_rows) ? kInt16 : kF32;
  if (mode == kF32) {
    p.run(chunks, [&](int64_t c) {
      const int64_t n0 = c * per, n1 = std::min(n, n0 + per);
      thread_local std::vector<uint8_t> scratch;
      const Rows r = natural_rows(type, w + n0 * rb, rb, n1 - n0, scratch);
      s.rows_f(r.type, r.w, rb, 0, n1 - n0, x, m, k, y + n0, n);
    });
  } else if (mode == kInt16) {
    run_q16(p, s, type, w, rb, n, k, x, m, y, per, chunks);
  } else {
    run_quantized<XBlock>(p, x, m, k, s.quantize_row, [&](const XBlock* xb, int64_t n0, int64_t n1) {
      thread_local std::vector<uint8_t> scratch;
      const Rows r = natural_rows(type, w + n0 * rb, rb, n1 - n0, scratch);
      s.rows(r.type, r.w, rb, 0, n1 - n0, xb, m, k / 32, y + n0, n);
    }, per, chunks, n);
  }
}

bool sgemm_available() { return global_sgemm() != nullptr; }

void set_sgemm(bool on) { g_sgemm_ok.store(on, std::memory_order_relaxed); }

void set_activations(const std::string& mode) {
  for (int i = 0; i < 4; ++i) {
    if (mode == kModeNames[i]) {
      g_mode.store(i, std::memory_order_relaxed);
      return;
    }
  }
  throw std::invalid_argument("activations must be auto, int16, int8 or f32, not '" + mode + "'");
}

std::string activations() { return kModeNames[g_mode.load(std::memory_order_relaxed)]; }

void dequantize(int type, const uint8_t* w, int64_t r, int64_t k, float* out) {
  const int64_t rb = row_bytes(type, k);
  if (rb <= 0) throw std::invalid_argument("gguf dequantize: unsupported type or row length");
  const Isa& s = isa();
  std::vector<uint8_t> scratch;
  for (int64_t i = 0; i < r; ++i) {
    const Rows row = natural_rows(type, w + i * rb, rb, 1, scratch);
    s.dequant_row(row.type, row.w, k, out + i * k);
  }
}

void parallel_for(int64_t tasks, const std::function<void(int64_t)>& fn) { pool().run(tasks, fn); }

}  // namespace gk
