// Work on several threads whose results are consumed in order, with a bounded number waiting.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace tessera::data {

// Runs produce(i) for i in [0, count) on `workers` threads and consume(i, result) on the calling
// thread in increasing i; at most `window` results exist at once, so memory stays bounded. The
// first exception (from either side) stops the work and is rethrown here.
template <class Result>
void ordered_parallel(size_t count, int workers, size_t window, const std::function<Result(size_t)>& produce,
                      const std::function<void(size_t, Result&&)>& consume) {
  std::vector<std::optional<Result>> slots(window);
  std::mutex mutex;
  std::condition_variable changed;
  size_t next_claim = 0, next_consume = 0;
  bool stop = false;
  std::exception_ptr failure;

  auto work = [&] {
    for (;;) {
      size_t index;
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stop || next_claim >= count || next_claim < next_consume + window; });
        if (stop || next_claim >= count) return;
        index = next_claim++;
      }
      try {
        Result result = produce(index);
        std::lock_guard lock(mutex);
        slots[index % window] = std::move(result);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!failure) failure = std::current_exception();
        stop = true;
      }
      changed.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < workers; ++t) threads.emplace_back(work);

  try {
    for (; next_consume < count;) {
      Result result;
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stop || slots[next_consume % window].has_value(); });
        if (stop) break;
        result = std::move(*slots[next_consume % window]);
        slots[next_consume % window].reset();
      }
      consume(next_consume, std::move(result));
      {
        std::lock_guard lock(mutex);
        ++next_consume;
      }
      changed.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex);
    if (!failure) failure = std::current_exception();
    stop = true;
  }
  {
    std::lock_guard lock(mutex);
    stop = true;
  }
  changed.notify_all();
  for (auto& thread : threads) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace tessera::data
