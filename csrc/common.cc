// Thread-local error text and view checks shared by every ABI entry point; the CPU executor
// scope and twinengine's persistent CPU thread pool.
#include "internal/common.h"

#include <sched.h>
#include <unistd.h>

#include <deque>
#include <sstream>
#include <thread>
#include <vector>

#include "internal/cpu.h"

namespace twe {
namespace {
thread_local std::string g_last_error;
}  // namespace

TweStatus fail(TweStatus status, const std::string& message) {
  g_last_error = message;
  return status;
}

TweStatus succeed() {
  g_last_error.clear();
  return kTweSuccess;
}

CpuStreamScope::CpuStreamScope(void* stream) : saved_(cpu::tls_executor) {
  cpu::tls_executor = static_cast<const TweCpuExecutor*>(stream);
}

CpuStreamScope::~CpuStreamScope() { cpu::tls_executor = saved_; }

namespace cpu {

int default_threads() {
  static const int threads = [] {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      const int n = CPU_COUNT(&set);
      if (n > 0) return n;
    }
#endif
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return threads;
}

namespace {

/*! Workers that run scheduled tasks in order; grown on demand, never stopped (a pool destroyed at
 *  process exit could join threads still blocked in other static destructors). */
class Pool {
 public:
  void schedule(int64_t threads, void (*task)(void*), void* arg) {
    std::unique_lock<std::mutex> lock(mutex_);
    queue_.push_back({task, arg});
    const int64_t want = std::min<int64_t>(threads, kMaxPieces);
    while (static_cast<int64_t>(workers_.size()) < want) {
      workers_.emplace_back([this] { loop(); });
      workers_.back().detach();
    }
    lock.unlock();
    cv_.notify_one();
  }

 private:
  struct Task {
    void (*fn)(void*);
    void* arg;
  };
  void loop() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return !queue_.empty(); });
      Task t = queue_.front();
      queue_.pop_front();
      lock.unlock();
      t.fn(t.arg);
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<std::thread> workers_;
};

}  // namespace

void pool_schedule(int64_t threads, void (*task)(void*), void* arg) {
  // A forked child inherits no worker threads (and maybe a locked mutex): it gets a fresh pool.
  static std::atomic<Pool*> pool{nullptr};
  static std::atomic<pid_t> owner{0};
  static std::mutex create;
  const pid_t pid = getpid();
  Pool* p = pool.load(std::memory_order_acquire);
  if (!p || owner.load(std::memory_order_acquire) != pid) {
    std::lock_guard<std::mutex> lock(create);
    p = pool.load(std::memory_order_acquire);
    if (!p || owner.load(std::memory_order_acquire) != pid) {
      p = new Pool();  // the old one (a parent's) is left: its threads do not exist here
      pool.store(p, std::memory_order_release);
      owner.store(pid, std::memory_order_release);
    }
  }
  p->schedule(threads, task, arg);
}

}  // namespace cpu

const char* dtype_name(TweDType dtype) {
  switch (dtype) {
    case kTweFloat32: return "float32";
    case kTweBFloat16: return "bfloat16";
    case kTweFloat16: return "float16";
    case kTweFloat8E4M3: return "float8_e4m3fn";
    case kTweFloat8E5M2: return "float8_e5m2";
    case kTweUInt8: return "uint8";
    case kTweInt32: return "int32";
    case kTweInt64: return "int64";
    case kTweUInt32: return "uint32";
  }
  return "unknown";
}

std::string shape_string(const TweTensorView& v) {
  std::ostringstream out;
  out << "(";
  for (int32_t i = 0; i < v.ndim; ++i) out << (i ? ", " : "") << v.shape[i];
  out << (v.ndim == 1 ? ",)" : ")");
  return out.str();
}

namespace {

TweStatus check_view_impl(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                          int64_t expect_cols, TweDevice device, bool allow_empty) {
  const bool empty_ok = allow_empty && v != nullptr && v->data == nullptr && v->ndim >= 0 &&
                        v->ndim <= TWE_MAX_DIMS && numel(*v) == 0;
  if (!present(v) && !empty_ok) return fail(kTweInvalidArgument, std::string(name) + " is missing");
  if (v->ndim < 0 || v->ndim > TWE_MAX_DIMS) return fail(kTweInvalidArgument, std::string(name) + " has a bad rank");
  if (v->dtype != dtype) {
    return fail(kTweInvalidArgument, std::string(name) + " must have dtype " + dtype_name(dtype) + ", got " +
                                         dtype_name(v->dtype));
  }
  if (v->device != device) return fail(kTweInvalidArgument, std::string(name) + " is on a different device");
  const bool shape_ok = expect_rows < 0 ? numel(*v) == expect_cols
                                        : (rows(*v) == expect_rows && cols(*v) == expect_cols);
  if (!shape_ok) {
    std::ostringstream out;
    out << name << " has shape " << shape_string(*v) << ", expected ";
    if (expect_rows < 0) out << expect_cols << " elements";
    else out << "(" << expect_rows << ", " << expect_cols << ") after flattening";
    return fail(kTweInvalidArgument, out.str());
  }
  return kTweSuccess;
}

}  // namespace

TweStatus check_view(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                     int64_t expect_cols, TweDevice device) {
  return check_view_impl(v, name, dtype, expect_rows, expect_cols, device, false);
}

TweStatus check_view_allow_empty(const TweTensorView* v, const char* name, TweDType dtype, int64_t expect_rows,
                                 int64_t expect_cols, TweDevice device) {
  return check_view_impl(v, name, dtype, expect_rows, expect_cols, device, true);
}

}  // namespace twe

extern "C" {

const char* twe_last_error(void) { return twe::g_last_error.c_str(); }

int twe_cpu_default_threads(void) { return twe::cpu::default_threads(); }

int twe_has_cuda(void) {
#ifdef TWE_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
