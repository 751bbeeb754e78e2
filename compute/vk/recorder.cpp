#include "compute/vk/recorder.h"

#include <stdexcept>
#include <vector>

#include "common/error.h"
#include "compute/vk/context.h"

namespace tessera::vk {

namespace {
constexpr VkPipelineStageFlags kDeviceStages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
constexpr VkAccessFlags kDeviceAccess = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                        VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
}  // namespace

Program::Program(Context& context) : context_(context) {
  VkCommandBufferAllocateInfo allocate{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  allocate.commandPool = context.command_pool();
  allocate.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  allocate.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(context.device(), &allocate, &command_buffer_), "vkAllocateCommandBuffers");
  VkFenceCreateInfo fence{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(context.device(), &fence, nullptr, &fence_), "vkCreateFence");
  if (context.profiling()) {
    VkQueryPoolCreateInfo pool{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    pool.queryType = VK_QUERY_TYPE_TIMESTAMP;
    pool.queryCount = kTimestamps;
    check(vkCreateQueryPool(context.device(), &pool, nullptr, &timestamps_), "vkCreateQueryPool");
  }
}

Program::~Program() {
  if (pending_) vkWaitForFences(context_.device(), 1, &fence_, VK_TRUE, UINT64_MAX);
  vkDestroyFence(context_.device(), fence_, nullptr);
  if (timestamps_) vkDestroyQueryPool(context_.device(), timestamps_, nullptr);
  vkFreeCommandBuffers(context_.device(), context_.command_pool(), 1, &command_buffer_);
}

void Program::submit() {
  if (pending_) wait();
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &command_buffer_;
  check(vkQueueSubmit(context_.queue(), 1, &submit, fence_), "vkQueueSubmit");
  pending_ = true;
}

void Program::wait() {
  if (!pending_) return;
  check(vkWaitForFences(context_.device(), 1, &fence_, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  check(vkResetFences(context_.device(), 1, &fence_), "vkResetFences");
  pending_ = false;
  if (labels_.empty()) return;
  std::vector<uint64_t> ticks(labels_.size() + 1);
  check(vkGetQueryPoolResults(context_.device(), timestamps_, 0, static_cast<uint32_t>(ticks.size()),
                              ticks.size() * sizeof(uint64_t), ticks.data(), sizeof(uint64_t),
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  double seconds_per_tick = context_.properties().limits.timestampPeriod * 1e-9;
  for (size_t i = 0; i < labels_.size(); ++i)
    context_.profile().add(labels_[i], static_cast<double>(ticks[i + 1] - ticks[i]) * seconds_per_tick);
}

Recorder::Recorder(Context& context, Program& program) : context_(context) { begin(program); }

void Recorder::begin(Program& program) {
  program_ = &program;
  command_buffer_ = program.handle();
  written_.clear();
  read_.clear();
  transfer_written_.clear();
  transfer_read_.clear();
  finished_ = false;
  check(vkResetCommandBuffer(command_buffer_, 0), "vkResetCommandBuffer");
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  check(vkBeginCommandBuffer(command_buffer_, &begin), "vkBeginCommandBuffer");
  program_->labels_.clear();
  if (program_->timestamps_) {
    vkCmdResetQueryPool(command_buffer_, program_->timestamps_, 0, Program::kTimestamps);
    vkCmdWriteTimestamp(command_buffer_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, program_->timestamps_, 0);
  }
  // Order this submit after everything an earlier submit did to the same buffers, and
  // after the host's writes.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = kDeviceAccess | VK_ACCESS_HOST_WRITE_BIT;
  barrier.dstAccessMask = kDeviceAccess;
  vkCmdPipelineBarrier(command_buffer_, kDeviceStages | VK_PIPELINE_STAGE_HOST_BIT, kDeviceStages, 0, 1,
                       &barrier, 0, nullptr, 0, nullptr);
}

Recorder::~Recorder() {
  if (!finished_) vkEndCommandBuffer(command_buffer_);
}

std::pair<uint32_t, uint32_t> Recorder::element_groups(uint64_t count, uint32_t local_size) {
  uint64_t groups = (count + local_size - 1) / local_size;
  if (groups == 0) groups = 1;
  constexpr uint64_t kMaxX = 32768;
  if (groups <= kMaxX) return {static_cast<uint32_t>(groups), 1};
  return {static_cast<uint32_t>(kMaxX), static_cast<uint32_t>((groups + kMaxX - 1) / kMaxX)};
}

void Recorder::timestamp(const std::string& command) {
  // Past the pool's end the rest of the program goes untimed rather than failing.
  if (!program_->timestamps_ || program_->labels_.size() + 1 >= Program::kTimestamps) return;
  program_->labels_.push_back(scope_.empty() ? command : scope_ + " " + command);
  vkCmdWriteTimestamp(command_buffer_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, program_->timestamps_,
                      static_cast<uint32_t>(program_->labels_.size()));
}

void Recorder::barrier(bool transfers) {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = transfers ? kDeviceAccess : VkAccessFlags{VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
  barrier.dstAccessMask = kDeviceAccess;
  vkCmdPipelineBarrier(command_buffer_, transfers ? kDeviceStages : VkPipelineStageFlags{VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT},
                       kDeviceStages, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  written_.clear();
  read_.clear();
  if (!transfers) return;
  transfer_written_.clear();
  transfer_read_.clear();
}

bool Recorder::hazard(VkBuffer buffer, Access access) const {
  return written_.count(buffer) || (access != Access::read && read_.count(buffer));
}

bool Recorder::transfer_hazard(VkBuffer buffer, Access access) const {
  return transfer_written_.count(buffer) || (access != Access::read && transfer_read_.count(buffer));
}

void Recorder::track(VkBuffer buffer, Access access) {
  if (access != Access::write) read_.insert(buffer);
  if (access != Access::read) written_.insert(buffer);
}

void Recorder::dispatch_raw(const Kernel& kernel, std::initializer_list<BufferArg> buffers,
                            const void* push, uint32_t push_size, uint32_t groups_x, uint32_t groups_y,
                            uint32_t groups_z) {
  if (buffers.size() != kernel.binding_count)
    throw Error(ExitCode::runtime_error, "kernel " + kernel.name + " takes " +
                                             std::to_string(kernel.binding_count) + " buffers, given " +
                                             std::to_string(buffers.size()));
  // What no plan let through: a count past the device's is undefined behaviour on a GPU.
  const uint32_t groups[3] = {groups_x, groups_y, groups_z};
  const uint32_t* most = context_.properties().limits.maxComputeWorkGroupCount;
  for (int axis = 0; axis < 3; ++axis)
    if (groups[axis] > most[axis])
      throw Error(ExitCode::bad_input, "kernel " + kernel.name + (scope_.empty() ? "" : " (" + scope_ + ")") +
                                           ": " + std::to_string(groups[axis]) + " workgroups in " + "xyz"[axis] +
                                           ", more than the device's " + std::to_string(most[axis]) +
                                           ": a layer too large for its kernel");
  // Hazards first: a barrier must precede this dispatch, not split its own arguments.
  bool any_hazard = false, transfer = false;
  for (auto& arg : buffers) {
    any_hazard = any_hazard || hazard(arg.buffer->handle(), arg.access);
    transfer = transfer || transfer_hazard(arg.buffer->handle(), arg.access);
  }
  if (any_hazard || transfer) barrier(transfer);
  for (auto& arg : buffers) track(arg.buffer->handle(), arg.access);

  // Sized once: the writes point into both.
  std::vector<VkDescriptorBufferInfo> infos(buffers.size());
  std::vector<VkBufferView> views(buffers.size(), VK_NULL_HANDLE);
  std::vector<VkWriteDescriptorSet> writes(buffers.size());
  for (uint32_t i = 0; i < writes.size(); ++i) {
    const BufferArg& arg = buffers.begin()[i];
    const VkDescriptorType type = kernel.binding_types[i];
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = type;
    if (type == VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER || type == VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER) {
      // An imageBuffer's format is fixed in its SPIR-V (the kernel's variant was chosen for the
      // operand's type): it gets the view of that format.
      TexelLayout texels = type == VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER ? kernel.image_texels[i]
                                                                          : TexelLayout{arg.half, arg.quads};
      views[i] = arg.bytes ? arg.buffer->window_view(arg.offset, arg.bytes, texels.half, texels.quads)
                           : arg.buffer->texel_view(texels.half, texels.quads);
      if (!views[i])
        throw Error(ExitCode::runtime_error, "kernel " + kernel.name + ": binding " + std::to_string(i) +
                                                 " reads texels, but the buffer has no texel view");
      writes[i].pTexelBufferView = &views[i];
    } else {
      if (kernel.half_storage[i] != arg.half)
        throw std::logic_error("kernel " + kernel.name + ": binding " + std::to_string(i) + " holds " +
                               (kernel.half_storage[i] ? "fp16" : "fp32 or integer") + " values, the buffer " +
                               (arg.half ? "fp16" : "not fp16"));
      infos[i] = {arg.buffer->handle(), arg.offset, arg.bytes ? arg.bytes : VK_WHOLE_SIZE};
      writes[i].pBufferInfo = &infos[i];
    }
  }
  vkCmdBindPipeline(command_buffer_, VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline);
  context_.push_descriptor_set()(command_buffer_, VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0,
                                 static_cast<uint32_t>(writes.size()), writes.data());
  if (push_size)
    vkCmdPushConstants(command_buffer_, kernel.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size, push);
  vkCmdDispatch(command_buffer_, groups_x, groups_y, groups_z);
  timestamp(kernel.name);
}

void Recorder::copy(const Buffer& source, uint64_t source_offset, const Buffer& destination,
                    uint64_t destination_offset, uint64_t bytes) {
  const bool transfer =
      transfer_hazard(source.handle(), Access::read) || transfer_hazard(destination.handle(), Access::write);
  if (transfer || hazard(source.handle(), Access::read) || hazard(destination.handle(), Access::write))
    barrier(transfer);
  transfer_read_.insert(source.handle());
  transfer_written_.insert(destination.handle());
  VkBufferCopy region{source_offset, destination_offset, bytes};
  vkCmdCopyBuffer(command_buffer_, source.handle(), destination.handle(), 1, &region);
  timestamp("copy");
}

void Recorder::fill(const Buffer& buffer, uint32_t value) {
  const bool transfer = transfer_hazard(buffer.handle(), Access::write);
  if (transfer || hazard(buffer.handle(), Access::write)) barrier(transfer);
  transfer_written_.insert(buffer.handle());
  vkCmdFillBuffer(command_buffer_, buffer.handle(), 0, VK_WHOLE_SIZE, value);
  timestamp("fill");
}

void Recorder::finish() {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = kDeviceAccess;
  barrier.dstAccessMask = kDeviceAccess | VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(command_buffer_, kDeviceStages, kDeviceStages | VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                       &barrier, 0, nullptr, 0, nullptr);
  check(vkEndCommandBuffer(command_buffer_), "vkEndCommandBuffer");
  finished_ = true;
}

void Recorder::continue_in(Program& next) {
  finish();
  begin(next);
}

}  // namespace tessera::vk
