// Dispatches and barriers recorded into one command buffer that is replayed step after step.
#pragma once
#include <vulkan/vulkan.h>

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "compute/vk/kernels.h"
#include "compute/vk/memory.h"

namespace tessera::vk {

class Context;

enum class Access : uint8_t { read, write, read_write };

// half: the buffer holds 16-bit floats; a samplerBuffer binding then reads it through its
// R16_SFLOAT view, and only a kernel's fp16 variant may bind it as a storage buffer. quads: a
// samplerBuffer binding reads four floats a texel (Buffer::texel_view). An imageBuffer binding
// reads the texels its shader declares, whatever these say. bytes: a window of the buffer,
// `bytes` from `offset` on (0: the whole buffer), which the kernel sees as its start.
struct BufferArg {
  const Buffer* buffer;
  Access access;
  bool half = false;
  bool quads = false;
  uint64_t offset = 0, bytes = 0;
};
inline BufferArg reads(const Buffer& b, bool half = false) { return {&b, Access::read, half}; }
inline BufferArg reads_quads(const Buffer& b, bool half = false) { return {&b, Access::read, half, true}; }
inline BufferArg writes(const Buffer& b, bool half = false) { return {&b, Access::write, half}; }
inline BufferArg updates(const Buffer& b, bool half = false) { return {&b, Access::read_write, half}; }
// `arg` bound to `bytes` of its buffer from `offset` on (a multiple of 256 bytes: every device's
// storage and texel offset alignment is at most that).
inline BufferArg window(BufferArg arg, uint64_t offset, uint64_t bytes) {
  arg.offset = offset;
  arg.bytes = bytes;
  return arg;
}

// A command buffer that is recorded once and submitted any number of times.
class Program {
 public:
  explicit Program(Context& context);
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  VkCommandBuffer handle() const { return command_buffer_; }
  void submit();  // queues the work; returns at once
  void wait();    // blocks until the last submit has finished; adds its times to a profile
  void run() {
    submit();
    wait();
  }

 private:
  friend class Recorder;
  // With a profiling context: timestamp 0 opens the program and timestamp i + 1 closes the
  // command named labels_[i].
  static constexpr uint32_t kTimestamps = 8192;

  Context& context_;
  VkCommandBuffer command_buffer_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  VkQueryPool timestamps_ = VK_NULL_HANDLE;
  std::vector<std::string> labels_;
  bool pending_ = false;
};

// Records into a Program. Inserts a barrier only where a dispatch touches a buffer that an
// earlier dispatch since the last barrier wrote (or writes one that it read), so independent
// dispatches may overlap. A barrier between dispatches waits for compute only: a copy (or fill)
// runs on beside the dispatches recorded after it (a streamed weight group's upload beside the
// group before it) until a command touches what it reads or writes, whose barrier waits for
// transfers too.
class Recorder {
 public:
  Recorder(Context& context, Program& program);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // A dispatch of `pipeline` with its push constants (of the type it was made for).
  template <class Push>
  void dispatch(const Pipeline<Push>& pipeline, std::initializer_list<BufferArg> buffers, const Push& push,
                uint32_t groups_x, uint32_t groups_y = 1, uint32_t groups_z = 1) {
    dispatch_raw(pipeline.kernel(), buffers, &push, sizeof(Push), groups_x, groups_y, groups_z);
  }
  void dispatch(const Pipeline<NoPush>& pipeline, std::initializer_list<BufferArg> buffers, uint32_t groups_x,
                uint32_t groups_y = 1, uint32_t groups_z = 1) {
    dispatch_raw(pipeline.kernel(), buffers, nullptr, 0, groups_x, groups_y, groups_z);
  }
  // One invocation per element for `count` elements in workgroups of `local_size`, spread over
  // x and y so that any count fits the dispatch limits; shaders index with global_index()
  // from shaders/common.glsl.
  template <class Push>
  void dispatch_elements(const Pipeline<Push>& pipeline, std::initializer_list<BufferArg> buffers, const Push& push,
                         uint64_t count, uint32_t local_size) {
    auto [x, y] = element_groups(count, local_size);
    dispatch(pipeline, buffers, push, x, y);
  }

  void copy(const Buffer& source, uint64_t source_offset, const Buffer& destination,
            uint64_t destination_offset, uint64_t bytes);
  void fill(const Buffer& buffer, uint32_t value);
  // Ends recording: makes every write visible to the host and to later submits.
  void finish();
  // Ends this program (as finish) and records what follows into `next`, which runs after the
  // host has looked at this one's results (--sync-bn's exchanges).
  void continue_in(Program& next);
  // Names the commands recorded from now on in profiles ("conv2": "conv2 conv2d_forward").
  void set_scope(std::string scope) { scope_ = std::move(scope); }

  static std::pair<uint32_t, uint32_t> element_groups(uint64_t count, uint32_t local_size);

 private:
  void dispatch_raw(const Kernel& kernel, std::initializer_list<BufferArg> buffers, const void* push,
                    uint32_t push_size, uint32_t groups_x, uint32_t groups_y, uint32_t groups_z);
  void begin(Program& program);
  bool hazard(VkBuffer buffer, Access access) const;
  // Against the copies and fills no barrier has waited for yet.
  bool transfer_hazard(VkBuffer buffer, Access access) const;
  void track(VkBuffer buffer, Access access);
  // transfers: wait for copies and fills too (and forget them), not only dispatches.
  void barrier(bool transfers);
  void timestamp(const std::string& command);

  Context& context_;
  Program* program_ = nullptr;
  VkCommandBuffer command_buffer_ = VK_NULL_HANDLE;
  std::string scope_;
  std::set<VkBuffer> written_, read_;                    // by dispatches since the last barrier
  std::set<VkBuffer> transfer_written_, transfer_read_;  // by copies and fills no barrier waited for
  bool finished_ = false;
};

}  // namespace tessera::vk
