// The series-parallel DP's memo of one probe (graphpipe_dp.h): a hash map from a state's key to
// its value, open addressing with linear probing, cleared in O(1) by bumping a generation. A
// probe visits up to millions of states; std::unordered_map's node allocations and bucket walks
// cost most of the DP's time. Keys are std::uint64_t or a pair of them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace graphpipe::partition::series_parallel_dp {

template <class Key, class Value>
class Memo {
 public:
  const Value* find(const Key& key) const { return find(key, hash(key)); }
  // find() with the key's hash() given: one key looked up in several memos is hashed once.
  const Value* find(const Key& key, std::size_t hashed) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = hashed & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.generation != generation_) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  // Asks the processor to fetch the slot where a look-up of the key with this hash() starts, so
  // that look-ups in several memos wait for memory once rather than once each.
  void prefetch(std::size_t hashed) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[hashed & mask_]);
  }
  static std::size_t hash(std::uint64_t k) { return mix(k); }
  static std::size_t hash(const std::pair<std::uint64_t, std::uint64_t>& k) { return mix(k.first ^ mix(k.second)); }
  void insert(const Key& key, const Value& value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.generation != generation_) {
        s = {key, generation_, value};
        ++size_;
        return;
      }
      if (s.key == key) {
        s.value = value;
        return;
      }
    }
  }
  void clear() {
    size_ = 0;
    if (++generation_ == 0) {  // wrapped: slots of generation 0 would look live
      slots_.assign(slots_.size(), Slot{});
      generation_ = 1;
    }
  }
  std::size_t size() const { return size_; }
  // Room for `count` entries without growing (an empty memo only).
  void reserve(std::size_t count) {
    std::size_t slots = 1024;
    while (slots < 2 * count + 2) slots *= 2;
    if (size_ == 0 && slots > slots_.size()) {
      slots_.assign(slots, Slot{});
      mask_ = slots - 1;
      generation_ = 1;
    }
  }
  // Calls f(key, value) for every live entry.
  template <class F>
  void for_each(F f) const {
    for (const Slot& s : slots_)
      if (s.generation == generation_) f(s.key, s.value);
  }

 private:
  // The key first, so that the generation packs beside it: with a 20-byte Entry a slot is 32
  // bytes (no slot straddles two cache lines), and a depth slot 16.
  struct Slot {
    Key key{};
    std::uint32_t generation = 0;
    Value value{};
  };
  static std::size_t mix(std::uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return static_cast<std::size_t>(x ^ (x >> 33));
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const std::uint32_t live = generation_;
    slots_.assign(std::max<std::size_t>(1024, old.size() * 2), Slot{});
    mask_ = slots_.size() - 1;
    generation_ = 1;
    size_ = 0;
    for (const Slot& s : old)
      if (s.generation == live) insert(s.key, s.value);
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
  std::uint32_t generation_ = 1;
};

}  // namespace graphpipe::partition::series_parallel_dp
