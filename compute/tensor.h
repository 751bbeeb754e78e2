// A named, shaped array in device memory.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compute/vk/memory.h"
#include "compute/vk/recorder.h"

namespace tessera {

namespace vk {
class Context;
}

using Shape = std::vector<int64_t>;
int64_t element_count(const Shape& shape);
std::string to_string(const Shape& shape);  // "[16,3,224,224]"

enum class DType : uint8_t { f32, u32, u8, f16 };
size_t element_size(DType dtype);

class Tensor {
 public:
  Tensor() = default;
  // windowed: kernels bind it in windows (vk::Allocator::allocate), so it may pass what one
  // binding reaches.
  Tensor(vk::Context& context, std::string name, Shape shape, DType dtype = DType::f32,
         vk::MemoryUsage usage = vk::MemoryUsage::device, bool windowed = false);
  // A tensor in a buffer it shares with others whose lifetimes do not overlap (activations
  // of inference, planned by Network); the buffer must hold at least bytes().
  Tensor(vk::Context& context, std::string name, Shape shape, DType dtype, std::shared_ptr<vk::Buffer> storage);

  const std::string& name() const { return name_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t count() const { return element_count(shape_); }
  uint64_t bytes() const { return static_cast<uint64_t>(count()) * element_size(dtype_); }
  const vk::Buffer& buffer() const { return *buffer_; }
  explicit operator bool() const { return buffer_ && *buffer_; }

  // Blocking copies between host and device (through a staging buffer where the memory is
  // not host-visible). For set-up, checkpoints and tests, not for the training loop. On a mapped
  // tensor they flush and invalidate (vk::Buffer::write and read): a download there drops what
  // the host wrote to it and did not flush.
  void upload(const void* data, uint64_t bytes, uint64_t offset = 0) const;
  void download(void* data, uint64_t bytes, uint64_t offset = 0) const;
  // Float values, converted to and from fp16 for an f16 tensor (rounded to nearest even).
  void upload(std::span<const float> values) const;
  std::vector<float> download() const;

 private:
  vk::Context* context_ = nullptr;
  std::string name_;
  Shape shape_;
  DType dtype_ = DType::f32;
  std::shared_ptr<vk::Buffer> buffer_;
};

// A tensor as a kernel argument: samplerBuffer bindings read it as texels of its own type.
inline vk::BufferArg reads(const Tensor& t) { return vk::reads(t.buffer(), t.dtype() == DType::f16); }
// Read as texels of four elements (a vec4 a texel in the shader).
inline vk::BufferArg reads_quads(const Tensor& t) { return vk::reads_quads(t.buffer(), t.dtype() == DType::f16); }
inline vk::BufferArg writes(const Tensor& t) { return vk::writes(t.buffer(), t.dtype() == DType::f16); }
inline vk::BufferArg updates(const Tensor& t) { return vk::updates(t.buffer(), t.dtype() == DType::f16); }

// Host conversions between float and IEEE binary16 (round to nearest even: exact at every power
// of two, subnormals kept, magnitudes from 65520 up become infinities; tests/test_half.cpp checks
// every float near each power of two against numpy). The one conversion: fp16 uploads and fp16
// feature files both use it.
std::vector<uint16_t> to_half(std::span<const float> values);
std::vector<float> from_half(std::span<const uint16_t> halves);
// Neither an infinity nor NaN (exponent bits not all ones).
constexpr bool is_finite_half(uint16_t half) { return (half & 0x7C00) != 0x7C00; }
// The index of the first of `values` that is not finite, or whose half is not (where `halves`,
// to_half of `values`, is given: a value that fp16 would store as an infinity); nullopt when none.
std::optional<size_t> first_non_finite(std::span<const float> values, std::span<const uint16_t> halves = {});

// Throws BadInput "WHAT holds NaN at index I (of N, in row-major order)" at the first value that
// is not finite: weights are checked where they enter, since one NaN makes every feature NaN.
void refuse_non_finite(std::span<const float> values, const std::string& what);
// In f16, a magnitude past 65504 (one fp16 would store as an infinity): BadInput naming WHAT, the
// index and the value. Weights' readers (read_checkpoint, SafetensorsFile::read) have already
// refused every value that is not finite.
void refuse_unrepresentable(std::span<const float> values, DType dtype, const std::string& what);
// Weights as they enter the device: refuse_unrepresentable, then uploaded in the tensor's type.
void upload_weights(const Tensor& tensor, std::span<const float> values, const std::string& what);

}  // namespace tessera
