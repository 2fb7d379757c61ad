// ThreadSanitizer annotations for Debian's Abseil, which is built without ThreadSanitizer.
//
// An Abseil built with TSan tells the sanitizer about every lock and unlock of an absl::Mutex
// (absl/base/internal/tsan_mutex_interface.h). Debian's libabsl_synchronization is not: its
// locks are atomics and futexes the sanitizer cannot see, so a TSan build of this project
// would report every access an absl::Mutex guards as a race. Linked into each executable of the
// TSan build (LLM_SANITIZE=thread, `make test-tsan`), this file defines the library's own entry
// points (absl::Mutex::Lock, CondVar::Wait, Notification::Notify, ... and the drop of an
// absl::Status's shared message). The executable exports them (-rdynamic), so every call
// resolves here, ours and those made by gRPC and by Abseil itself, which calls its own
// functions through the PLT. Each wrapper calls the library's function (found with
// dlsym(RTLD_NEXT)) and tells the sanitizer what it did, with the same __tsan_mutex_* calls
// Abseil makes when built with TSan.
//
// What this does not cover: synchronization made of bare atomics inside other uninstrumented
// libraries (gRPC's completion queues and closures, libgomp's barriers). For those the TSan
// build runs the CPU pool with one thread, and tests/sanitizers/tsan_suppressions.txt names
// the reports gRPC's hand-offs would give.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/base/options.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define LLM_STR2(x) #x
#define LLM_STR(x) LLM_STR2(x)

// The mangled name of absl::<inline namespace>::<rest>, `rest` mangled as it follows a nested
// name's prefix ("5Mutex4LockEv" for Mutex::Lock()); "K" before it for a const member function.
std::string AbslSymbol(const char* rest) {
  const bool is_const = rest[0] == 'K';
  const std::string ns = LLM_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::string(is_const ? "_ZNK" : "_ZN") + "4absl" + std::to_string(ns.size()) + ns +
         (rest + (is_const ? 1 : 0));
}

template <typename Fn>
Fn Real(const char* rest) {
  const std::string name = AbslSymbol(rest);
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_mutex_tsan: %s not found in the Abseil library: %s\n", name.c_str(),
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

// In each wrapper: `real`, the library's function of that mangled name.
#define LLM_REAL(type, rest) static const auto real = Real<type>(rest)

using MutexFn = void (*)(absl::Mutex*);
using MutexTryFn = bool (*)(absl::Mutex*);
using MutexWhenFn = void (*)(absl::Mutex*, const absl::Condition&);
using MutexWhenTimeoutFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Duration);
using MutexWhenDeadlineFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Time);
using CondVarWaitFn = void (*)(absl::CondVar*, absl::Mutex*);
using CondVarWaitTimeoutFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Duration);
using CondVarWaitDeadlineFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Time);
using NotifyFn = void (*)(absl::Notification*);
using UnrefFn = void (*)(uintptr_t);
using WaitFn = void (*)(const absl::Notification*);
using WaitTimeoutFn = bool (*)(const absl::Notification*, absl::Duration);
using WaitDeadlineFn = bool (*)(const absl::Notification*, absl::Time);

constexpr unsigned kRead = __tsan_mutex_read_lock;

// The library's functions call each other through the PLT too (LockWhenWithTimeout calls
// LockWhenWithDeadline, CondVar::WaitWithTimeout calls WaitWithDeadline), so that they reach
// these wrappers again: only the outermost call of a thread is told to the sanitizer.
thread_local int t_depth = 0;
class Outermost {
 public:
  Outermost() : outer_(t_depth++ == 0) {}
  ~Outermost() { --t_depth; }
  explicit operator bool() const { return outer_; }

 private:
  const bool outer_;
};

// What a call to the library does to a mutex, as the sanitizer is told it: before the call
// (pre_) and after (post_). The sanitizer ignores memory accesses between a pre_ and a post_
// call, and the library evaluates waiters' Conditions (our code, instrumented) inside its
// locks, unlocks and waits, under the real lock but not under the sanitizer's: each call to the
// library stays inside such a pair, as Abseil's own annotations keep it.
enum class Op {
  kLock,     // returns holding the mutex
  kTryLock,  // returns holding it if it returns true
  kUnlock,
  kWait,  // called holding it: releases it while waiting and holds it again when it returns
};

void Before(Op op, void* mu, unsigned flags) {
  if (op == Op::kLock || op == Op::kTryLock) {
    __tsan_mutex_pre_lock(mu, flags);
  } else {
    __tsan_mutex_pre_unlock(mu, flags);
  }
}

void After(Op op, void* mu, unsigned flags, bool taken) {
  switch (op) {
    case Op::kLock:
    case Op::kTryLock:
      __tsan_mutex_post_lock(mu, taken ? flags : flags | __tsan_mutex_try_lock_failed, 0);
      break;
    case Op::kUnlock:
      __tsan_mutex_post_unlock(mu, flags);
      break;
    case Op::kWait:
      __tsan_mutex_post_unlock(mu, flags);
      __tsan_mutex_pre_lock(mu, flags);
      __tsan_mutex_post_lock(mu, flags, 0);
      break;
  }
}

// Runs `call` (the library's function) as `op` on `mu`, told to the sanitizer if it is this
// thread's outermost call; returns what `call` returns.
template <typename Call>
auto Annotated(Op op, void* mu, unsigned flags, Call call) -> decltype(call()) {
  const Outermost outer;
  if (outer) Before(op, mu, flags);
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    if (outer) After(op, mu, flags, /*taken=*/true);
  } else {
    const auto result = call();
    if (outer) After(op, mu, flags, /*taken=*/op != Op::kTryLock || result);
    return result;
  }
}

// Whether `pc` is in this executable's code (not in a shared library).
bool IsThisExecutable(const void* pc) {
  static const void* const self = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<const void*>(&IsThisExecutable), &info);
    return info.dli_fbase;
  }();
  Dl_info info{};
  return dladdr(pc, &info) != 0 && info.dli_fbase == self;
}

// Notification's flag, read by the inline (instrumented) HasBeenNotified with an acquire load:
// Notify releases on its address as the library's store would have.
const void* NotifiedFlag(const absl::Notification* n) {
  static_assert(sizeof(absl::Notification) == 2 * sizeof(absl::Mutex),
                "absl::Notification is no longer {Mutex mutex_; atomic<bool> notified_yet_;}");
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// The destruction of a mutex is told only when this executable's code destroys it: gRPC frees
// its objects (and their mutexes) when an atomic reference count, which the sanitizer cannot
// see, falls to zero, so each such destruction would look like a race with the last unlock.
Mutex::~Mutex() {
  LLM_REAL(MutexFn, "5MutexD1Ev");
  const Outermost outer;
  if (outer && IsThisExecutable(__builtin_return_address(0))) __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  LLM_REAL(MutexFn, "5Mutex4LockEv");
  Annotated(Op::kLock, this, 0, [&] { real(this); });
}

void Mutex::ReaderLock() {
  LLM_REAL(MutexFn, "5Mutex10ReaderLockEv");
  Annotated(Op::kLock, this, kRead, [&] { real(this); });
}

bool Mutex::TryLock() {
  LLM_REAL(MutexTryFn, "5Mutex7TryLockEv");
  return Annotated(Op::kTryLock, this, __tsan_mutex_try_lock, [&] { return real(this); });
}

bool Mutex::ReaderTryLock() {
  LLM_REAL(MutexTryFn, "5Mutex13ReaderTryLockEv");
  return Annotated(Op::kTryLock, this, kRead | __tsan_mutex_try_lock, [&] { return real(this); });
}

void Mutex::Unlock() {
  LLM_REAL(MutexFn, "5Mutex6UnlockEv");
  Annotated(Op::kUnlock, this, 0, [&] { real(this); });
}

void Mutex::ReaderUnlock() {
  LLM_REAL(MutexFn, "5Mutex12ReaderUnlockEv");
  Annotated(Op::kUnlock, this, kRead, [&] { real(this); });
}

void Mutex::LockWhen(const Condition& cond) {
  LLM_REAL(MutexWhenFn, "5Mutex8LockWhenERKNS0_9ConditionE");
  Annotated(Op::kLock, this, 0, [&] { real(this, cond); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  LLM_REAL(MutexWhenFn, "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Annotated(Op::kLock, this, kRead, [&] { real(this, cond); });
}

// The timed forms hold the mutex when they return, whether the condition became true or not.
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  LLM_REAL(MutexWhenTimeoutFn, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Annotated(Op::kLock, this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  LLM_REAL(MutexWhenDeadlineFn, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Annotated(Op::kLock, this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  LLM_REAL(MutexWhenTimeoutFn, "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Annotated(Op::kLock, this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  LLM_REAL(MutexWhenDeadlineFn, "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Annotated(Op::kLock, this, kRead, [&] { return real(this, cond, deadline); });
}

// Await* are called with the mutex held (in either mode; Abseil does not say which to the
// sanitizer either): they release it while waiting and hold it again when they return.
void Mutex::Await(const Condition& cond) {
  LLM_REAL(MutexWhenFn, "5Mutex5AwaitERKNS0_9ConditionE");
  Annotated(Op::kWait, this, 0, [&] { real(this, cond); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  LLM_REAL(MutexWhenTimeoutFn, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Annotated(Op::kWait, this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  LLM_REAL(MutexWhenDeadlineFn, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Annotated(Op::kWait, this, 0, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  LLM_REAL(CondVarWaitFn, "7CondVar4WaitEPNS0_5MutexE");
  Annotated(Op::kWait, mu, 0, [&] { real(this, mu); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  LLM_REAL(CondVarWaitTimeoutFn, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Annotated(Op::kWait, mu, 0, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  LLM_REAL(CondVarWaitDeadlineFn, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Annotated(Op::kWait, mu, 0, [&] { return real(this, mu, deadline); });
}

// Notify publishes what was written before it; a wait that returns notified sees it. The
// library's own mutex_ covers the waits that block; these cover the fast paths, which only
// load the flag.
void Notification::Notify() {
  LLM_REAL(NotifyFn, "12Notification6NotifyEv");
  __tsan_release(const_cast<void*>(NotifiedFlag(this)));
  real(this);
}

void Notification::WaitForNotification() const {
  LLM_REAL(WaitFn, "K12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  LLM_REAL(WaitTimeoutFn, "K12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  LLM_REAL(WaitDeadlineFn, "K12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
  return notified;
}

// absl::Status shares a heap-allocated message between copies with an atomic reference
// count, dropped in the library (UnrefNonInlined), which deletes the message at zero: each
// drop is made a release and an acquire on the shared part, so that the thread that deletes it
// is ordered after every other that used it.
void Status::UnrefNonInlined(uintptr_t rep) {
  LLM_REAL(UnrefFn, "6Status15UnrefNonInlinedEm");
  void* const shared = reinterpret_cast<void*>(rep - 1);  // as Status::RepToPointer
  __tsan_release(shared);
  __tsan_acquire(shared);
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl
