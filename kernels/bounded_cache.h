// A map that keeps at most `capacity` entries, dropping the least recently
// used one when a new entry would exceed it. The kernels and steps keep
// compiled state (oneDNN primitives, their scratch, broadcast plans) per
// shape in one: a model served without batching takes any number of rows
// per request, and one primitive per row count ever seen would grow
// without limit. A dropped shape is compiled again if it comes back.
//
// A pointer or reference into the cache is valid only until the next
// Emplace into the same cache (which may drop that very entry); Find and
// Peek never invalidate one. Not thread-safe, like the kernels holding it.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <utility>

namespace numaserve::kernels {

// Entries a kernel keeps per shape: two per batch plan the engine keeps
// (CompileOptions::batch_plans, 64), since a batch run in slices prepares
// a full slice's shape and the last slice's.
inline constexpr size_t kShapeCacheCapacity = 128;

// `Compare` is transparent by default, so a key can be looked up through a
// view of it (a std::tuple of references for a std::tuple key) without a copy.
template <typename Key, typename Value, typename Compare = std::less<>>
class BoundedCache {
 public:
  // Entries kept by default: the engine's batch-plan count.
  static constexpr size_t kDefaultCapacity = 64;

  // capacity 0 is taken as 1: the entry just emplaced is always kept.
  explicit BoundedCache(size_t capacity = kDefaultCapacity)
      : capacity_(capacity > 0 ? capacity : 1) {}

  // Movable (the entries and the recency list move with their nodes), not
  // copyable.
  BoundedCache(const BoundedCache&) = delete;
  BoundedCache& operator=(const BoundedCache&) = delete;
  BoundedCache(BoundedCache&&) noexcept = default;
  BoundedCache& operator=(BoundedCache&&) noexcept = default;

  // The entry for `key`, marked most recently used; null if absent.
  template <typename K>
  Value* Find(const K& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    recency_.splice(recency_.begin(), recency_, it->second.recency);
    return &it->second.value;
  }

  // The entry for `key` without marking it used (for const queries).
  template <typename K>
  const Value* Peek(const K& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second.value;
  }

  template <typename K>
  bool contains(const K& key) const {
    return entries_.find(key) != entries_.end();
  }

  // Inserts (or replaces) the entry for `key`, marks it most recently used
  // and drops the least recently used ones beyond the capacity.
  Value& Emplace(Key key, Value value) {
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      it->second.value = std::move(value);
      recency_.splice(recency_.begin(), recency_, it->second.recency);
      return it->second.value;
    }
    it = entries_.emplace(std::move(key), Slot{std::move(value), {}}).first;
    recency_.push_front(&it->first);
    it->second.recency = recency_.begin();
    while (entries_.size() > capacity_) {
      entries_.erase(entries_.find(*recency_.back()));
      recency_.pop_back();
    }
    return it->second.value;
  }

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Slot {
    Value value;
    typename std::list<const Key*>::iterator recency;
  };

  size_t capacity_;
  std::map<Key, Slot, Compare> entries_;
  // Most recently used first: the keys of entries_ (map nodes do not move).
  std::list<const Key*> recency_;
};

}  // namespace numaserve::kernels
