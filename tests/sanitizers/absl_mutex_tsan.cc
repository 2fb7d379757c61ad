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

// The sanitizer's view of a lock the library has just taken (or failed to take).
void Locked(void* mu, unsigned flags, bool taken = true) {
  __tsan_mutex_post_lock(mu, taken ? flags : flags | __tsan_mutex_try_lock_failed, 0);
}

// Around a call that releases `mu` and holds it again when it returns (a wait). The sanitizer
// ignores memory accesses between a pre_ and a post_ call: the library evaluates waiters'
// Conditions (our code, instrumented) inside Lock, Unlock and the waits, under the real lock but
// not under the sanitizer's, so each call to the library stays inside such a pair, as Abseil's
// own annotations keep them.
void BeginWait(void* mu, unsigned flags) { __tsan_mutex_pre_unlock(mu, flags); }
void EndWait(void* mu, unsigned flags) {
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
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
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, 0);
  real(this);
  if (outer) Locked(this, 0);
}

void Mutex::ReaderLock() {
  LLM_REAL(MutexFn, "5Mutex10ReaderLockEv");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, kRead);
  real(this);
  if (outer) Locked(this, kRead);
}

bool Mutex::TryLock() {
  LLM_REAL(MutexTryFn, "5Mutex7TryLockEv");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool taken = real(this);
  if (outer) Locked(this, __tsan_mutex_try_lock, taken);
  return taken;
}

bool Mutex::ReaderTryLock() {
  LLM_REAL(MutexTryFn, "5Mutex13ReaderTryLockEv");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, kRead | __tsan_mutex_try_lock);
  const bool taken = real(this);
  if (outer) Locked(this, kRead | __tsan_mutex_try_lock, taken);
  return taken;
}

void Mutex::Unlock() {
  LLM_REAL(MutexFn, "5Mutex6UnlockEv");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_unlock(this, 0);
  real(this);
  if (outer) __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  LLM_REAL(MutexFn, "5Mutex12ReaderUnlockEv");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  if (outer) __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  LLM_REAL(MutexWhenFn, "5Mutex8LockWhenERKNS0_9ConditionE");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  if (outer) Locked(this, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  LLM_REAL(MutexWhenFn, "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, kRead);
  real(this, cond);
  if (outer) Locked(this, kRead);
}

// The timed forms hold the mutex when they return, whether the condition became true or not.
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  LLM_REAL(MutexWhenTimeoutFn, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, 0);
  const bool met = real(this, cond, timeout);
  if (outer) Locked(this, 0);
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  LLM_REAL(MutexWhenDeadlineFn, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, 0);
  const bool met = real(this, cond, deadline);
  if (outer) Locked(this, 0);
  return met;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  LLM_REAL(MutexWhenTimeoutFn, "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, kRead);
  const bool met = real(this, cond, timeout);
  if (outer) Locked(this, kRead);
  return met;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  LLM_REAL(MutexWhenDeadlineFn, "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Outermost outer;
  if (outer) __tsan_mutex_pre_lock(this, kRead);
  const bool met = real(this, cond, deadline);
  if (outer) Locked(this, kRead);
  return met;
}

// Await* are called with the mutex held (in either mode; Abseil does not say which to the
// sanitizer either): they release it while waiting and hold it again when they return.
void Mutex::Await(const Condition& cond) {
  LLM_REAL(MutexWhenFn, "5Mutex5AwaitERKNS0_9ConditionE");
  const Outermost outer;
  if (outer) BeginWait(this, 0);
  real(this, cond);
  if (outer) EndWait(this, 0);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  LLM_REAL(MutexWhenTimeoutFn, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const Outermost outer;
  if (outer) BeginWait(this, 0);
  const bool met = real(this, cond, timeout);
  if (outer) EndWait(this, 0);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  LLM_REAL(MutexWhenDeadlineFn, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const Outermost outer;
  if (outer) BeginWait(this, 0);
  const bool met = real(this, cond, deadline);
  if (outer) EndWait(this, 0);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  LLM_REAL(CondVarWaitFn, "7CondVar4WaitEPNS0_5MutexE");
  const Outermost outer;
  if (outer) BeginWait(mu, 0);
  real(this, mu);
  if (outer) EndWait(mu, 0);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  LLM_REAL(CondVarWaitTimeoutFn, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  const Outermost outer;
  if (outer) BeginWait(mu, 0);
  const bool timed_out = real(this, mu, timeout);
  if (outer) EndWait(mu, 0);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  LLM_REAL(CondVarWaitDeadlineFn, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  const Outermost outer;
  if (outer) BeginWait(mu, 0);
  const bool timed_out = real(this, mu, deadline);
  if (outer) EndWait(mu, 0);
  return timed_out;
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
