// A bounded queue between two threads (extract's reader, device and writer). close() ends it
// after what is queued; stop() ends it at once, dropping what is queued.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>

namespace tessera {

template <class T>
class Channel {
 public:
  explicit Channel(size_t capacity) : capacity_(capacity) {}
  // False once the channel has ended (the reader is gone): the writer stops.
  bool push(T &&item) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    changed_.notify_all();
    return true;
  }
  // False at the end.
  bool pop(T &item) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return false;
    item = std::move(items_.front());
    items_.pop_front();
    changed_.notify_all();
    return true;
  }
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    changed_.notify_all();
  }
  void stop() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    items_.clear();
    changed_.notify_all();
  }

 private:
  size_t capacity_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<T> items_;
  bool closed_ = false;
};

}  // namespace tessera
