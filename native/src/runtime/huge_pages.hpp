// Memory for large buffers that are streamed (a layer's packed weights, the read-bandwidth
// measurement): 2 MiB-aligned and advised for transparent huge pages, so a stream through
// them takes one TLB entry per 2 MiB instead of one per 4 KiB page. Zero-filled.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kt {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(std::size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Whether Linux accepted the advice (it is a no-op where THP is "never").
  bool advised() const { return advised_; }

 private:
  void release();
  void* mapping_ = nullptr;
  std::size_t mapped_ = 0;
  uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  bool advised_ = false;
};

}  // namespace kt
