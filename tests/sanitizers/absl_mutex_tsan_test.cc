// Checks absl_mutex_tsan.cc in the TSan build: data handed between threads through absl::Mutex,
// CondVar, Mutex::Await, Notification (blocking and polled) and a timed LockWhen is not reported,
// and an unguarded write still is. Run by ctest twice: without arguments (no report: exit 0)
// and with "race" (a report is expected in the output).
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

int guarded = 0;
int published = 0;
int unguarded = 0;

void HandOffs() {
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&mu] {
      for (int k = 0; k < 1000; ++k) {
        absl::MutexLock lock(&mu);
        ++guarded;
      }
    });
  }
  for (std::thread& t : threads) t.join();

  absl::CondVar cv;
  bool ready = false;
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    while (!ready) cv.Wait(&mu);
    ++guarded;
  });
  {
    absl::MutexLock lock(&mu);
    guarded += 10;
    ready = true;
    cv.Signal();
  }
  waiter.join();

  bool go = false;
  std::thread awaiter([&] {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&go));
    ++guarded;
  });
  {
    absl::MutexLock lock(&mu);
    go = true;
  }
  awaiter.join();

  bool timed_go = false;
  std::thread timed([&] {
    if (mu.LockWhenWithTimeout(absl::Condition(&timed_go), absl::Seconds(30))) ++guarded;
    mu.Unlock();
  });
  absl::SleepFor(absl::Milliseconds(20));
  {
    absl::MutexLock lock(&mu);
    timed_go = true;
  }
  timed.join();

  for (int polled = 0; polled < 2; ++polled) {
    absl::Notification done;
    std::thread publisher([&] {
      published += 42;
      done.Notify();
    });
    if (polled == 1) {
      while (!done.HasBeenNotified()) std::this_thread::yield();
    } else {
      done.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    published += 1;
    publisher.join();
  }
}

}  // namespace

int main(int argc, char** argv) {
  HandOffs();
  std::printf("guarded %d, published %d\n", guarded, published);
  if (argc > 1 && std::strcmp(argv[1], "race") == 0) {
    std::thread a([] { ++unguarded; });
    std::thread b([] { ++unguarded; });
    a.join();
    b.join();
  }
  return guarded == 4000 + 13 && published == 86 ? 0 : 1;
}
