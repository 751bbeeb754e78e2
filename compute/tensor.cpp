#include "compute/tensor.h"

#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/error.h"
#include "common/units.h"
#include "compute/vk/context.h"
#include "compute/vk/recorder.h"

namespace tessera {

int64_t element_count(const Shape& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string to_string(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::u32: return 4;
    case DType::f16: return 2;
    case DType::u8: return 1;
  }
  return 4;
}

Tensor::Tensor(vk::Context& context, std::string name, Shape shape, DType dtype, vk::MemoryUsage usage, bool windowed)
    : context_(&context), name_(std::move(name)), shape_(std::move(shape)), dtype_(dtype) {
  // Round up to whole 32-bit words: shaders address storage buffers in words.
  uint64_t size = (bytes() + 3) / 4 * 4;
  buffer_ = std::make_shared<vk::Buffer>(context.allocator().allocate(size, usage, name_, windowed));
}

Tensor::Tensor(vk::Context& context, std::string name, Shape shape, DType dtype, std::shared_ptr<vk::Buffer> storage)
    : context_(&context), name_(std::move(name)), shape_(std::move(shape)), dtype_(dtype), buffer_(std::move(storage)) {
  if (buffer_->size() < bytes())
    throw Error(ExitCode::runtime_error, name_ + ": a shared buffer of " + std::to_string(buffer_->size()) +
                                             " bytes cannot hold " + std::to_string(bytes()));
}

void Tensor::upload(const void* data, uint64_t size, uint64_t offset) const {
  if (offset + size > buffer_->size())
    throw Error(ExitCode::runtime_error, "upload of " + std::to_string(size) + " bytes overruns " + name_);
  if (buffer_->mapped()) return buffer_->write(data, size, offset);
  // No kernel binds it (a copy reads it), so it may pass what one binding reaches.
  auto staging = context_->allocator().allocate(size, vk::MemoryUsage::staging, name_ + " (upload)", true);
  staging.write(data, size);
  vk::Program program(*context_);
  {
    vk::Recorder recorder(*context_, program);
    recorder.set_scope("upload");
    recorder.copy(staging, 0, *buffer_, offset, size);
    recorder.finish();
  }
  program.run();
}

void Tensor::download(void* data, uint64_t size, uint64_t offset) const {
  if (offset + size > buffer_->size())
    throw Error(ExitCode::runtime_error, "download of " + std::to_string(size) + " bytes overruns " + name_);
  if (buffer_->mapped()) return buffer_->read(data, size, offset);
  auto staging = context_->allocator().allocate(size, vk::MemoryUsage::staging, name_ + " (download)", true);
  vk::Program program(*context_);
  {
    vk::Recorder recorder(*context_, program);
    recorder.set_scope("download");
    recorder.copy(*buffer_, offset, staging, 0, size);
    recorder.finish();
  }
  program.run();
  staging.read(data, size);
}

void Tensor::upload(std::span<const float> values) const {
  if (dtype_ != DType::f16) return upload(values.data(), values.size_bytes());
  auto halves = to_half(values);
  upload(halves.data(), halves.size() * sizeof(uint16_t));
}

std::vector<float> Tensor::download() const {
  std::vector<float> values(static_cast<size_t>(count()));
  if (dtype_ != DType::f16) {
    download(values.data(), values.size() * sizeof(float));
    return values;
  }
  std::vector<uint16_t> halves(values.size());
  download(halves.data(), halves.size() * sizeof(uint16_t));
  return from_half(halves);
}

// _Float16 is the compiler's IEEE binary16 (GCC and Clang on x86-64 and AArch64). On x86-64
// without -mf16c its casts are libgcc calls, a fifth of loading a ViT-H with fp16 weights: where the
// CPU has F16C, its instructions convert eight values at once, with the same rounding (to nearest
// even) and the same NaNs (quieted, payload truncated) as the casts.
namespace {
void to_half_portable(const float* values, uint16_t* halves, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    auto half = static_cast<_Float16>(values[i]);
    std::memcpy(&halves[i], &half, sizeof half);
  }
}

void from_half_portable(const uint16_t* halves, float* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    _Float16 half;
    std::memcpy(&half, &halves[i], sizeof half);
    values[i] = static_cast<float>(half);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void to_half_f16c(const float* values, uint16_t* halves, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(halves + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(values + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < count; ++i) halves[i] = _cvtss_sh(values[i], _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("avx,f16c"))) void from_half_f16c(const uint16_t* halves, float* values, size_t count) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(values + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(halves + i))));
  for (; i < count; ++i) values[i] = _cvtsh_ss(halves[i]);
}

const bool cpu_has_f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#endif
}  // namespace

std::vector<uint16_t> to_half(std::span<const float> values) {
  std::vector<uint16_t> halves(values.size());
#if defined(__x86_64__)
  if (cpu_has_f16c) {
    to_half_f16c(values.data(), halves.data(), values.size());
    return halves;
  }
#endif
  to_half_portable(values.data(), halves.data(), values.size());
  return halves;
}

std::vector<float> from_half(std::span<const uint16_t> halves) {
  std::vector<float> values(halves.size());
#if defined(__x86_64__)
  if (cpu_has_f16c) {
    from_half_f16c(halves.data(), values.data(), halves.size());
    return values;
  }
#endif
  from_half_portable(halves.data(), values.data(), halves.size());
  return values;
}

std::optional<size_t> first_non_finite(std::span<const float> values, std::span<const uint16_t> halves) {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]) || (!halves.empty() && !is_finite_half(halves[i]))) return i;
  return std::nullopt;
}

void refuse_non_finite(std::span<const float> values, const std::string& what) {
  std::optional<size_t> bad = first_non_finite(values);
  if (!bad) return;
  const float value = values[*bad];
  throw BadInput(what + " holds " + (std::isnan(value) ? "NaN" : value > 0 ? "+Inf" : "-Inf") + " at index " +
                 std::to_string(*bad) + " (of " + std::to_string(values.size()) + ", in row-major order)");
}

namespace {
// The values in fp16, refusing (BadInput) one that fp16 would hold as an infinity.
std::vector<uint16_t> halves_of_weights(std::span<const float> values, const std::string& what) {
  std::vector<uint16_t> halves = to_half(values);
  if (std::optional<size_t> bad = first_non_finite(values, halves))
    throw BadInput(what + " holds " + format_number(values[*bad]) + " at index " + std::to_string(*bad) + " (of " +
                   std::to_string(values.size()) + ", in row-major order), past fp16's largest value 65504: " +
                   "--weights fp16 cannot hold it (give --weights fp32)");
  return halves;
}
}  // namespace

void refuse_unrepresentable(std::span<const float> values, DType dtype, const std::string& what) {
  if (dtype == DType::f16) halves_of_weights(values, what);
}

void upload_weights(const Tensor& tensor, std::span<const float> values, const std::string& what) {
  if (tensor.dtype() != DType::f16) return tensor.upload(values);
  std::vector<uint16_t> halves = halves_of_weights(values, what);
  tensor.upload(halves.data(), halves.size() * sizeof(uint16_t));
}

}  // namespace tessera
