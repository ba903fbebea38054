// on_workers: the pool that plans the micro-batch sizes (partition() and partition_candidates,
// partitioner.cpp). Each of `width` workers, the calling thread one of them, asks take() for the
// next index (nullopt: none left), runs work(index), and hands its result to keep(index,
// result). take() and keep() run under one lock, work() outside it, so a worker takes a new index
// as soon as it is free and take() may decide from the results kept so far (partition() skips
// the sizes that can no longer win). An exception in work() stops take() being asked again and
// reaches the caller from the smallest index that threw, after every worker has ended; take()
// and keep() must not throw.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace graphpipe::partition {

template <class Take, class Work, class Keep>
void on_workers(std::size_t width, std::size_t count, Take take, Work work, Keep keep) {
  std::mutex mutex;
  bool failed = false;
  std::vector<std::exception_ptr> errors(count);
  auto worker = [&] {
    for (;;) {
      std::optional<std::size_t> i;
      {
        const std::lock_guard<std::mutex> lock(mutex);
        if (failed || !(i = take())) return;
      }
      try {
        auto result = work(*i);
        const std::lock_guard<std::mutex> lock(mutex);
        keep(*i, std::move(result));
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        errors[*i] = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::future<void>> helpers;
  for (std::size_t w = 1; w < std::min(width, count); ++w) helpers.push_back(std::async(std::launch::async, worker));
  worker();
  for (auto& helper : helpers) helper.wait();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace graphpipe::partition
