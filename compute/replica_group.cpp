#include "compute/replica_group.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

ReplicaGroup::ReplicaGroup(const std::vector<vk::Context*>& devices, const LoopSettings& settings,
                           const TrainingJob& job)
    : settings_(settings),
      job_(job),
      processes_(Processes::world()),
      labels_input_(staged_input_index(job.staged, "labels")),
      valid_input_(staged_input_index(job.staged, "valid")) {
  int local = static_cast<int>(devices.size());
  int replicas_total = local * processes_.size();
  batch_ = job.staged[labels_input_].shape[0];
  bool replicated = replicas_total > 1;
  if (replicated && batch_ < replicas_total)
    throw UsageError("--devices: " + std::to_string(replicas_total) + " replicas (" + std::to_string(local) +
                     " devices x " + std::to_string(processes_.size()) +
                     " processes) need at least one sample each, but a micro-batch has " + std::to_string(batch_) +
                     (batch_ == 1 ? " (a slide-level head trains on one bag at a time)" : " (--batch)"));
  for (auto& input : job.staged)
    if (replicated && input.name != "valid" && (input.shape.empty() || input.shape[0] != batch_))
      throw std::logic_error("data-parallel training splits staged inputs by their first dimension; " + input.name +
                             " is " + to_string(input.shape));
  for (int d = 0; d < local; ++d) {
    int replica = processes_.rank() * local + d;
    BatchPart part = replicated ? batch_part(batch_, replica, replicas_total) : BatchPart{0, batch_};
    replicas_.push_back(
        std::make_unique<Replica>(*devices[static_cast<size_t>(d)], settings, job, batch_, part, replicated));
  }
  replicas_in_job_ = replicas_total;
  if (settings.sync_batch_norm && !replicated)
    throw UsageError("--sync-bn combines batch norm statistics over replicas, and this run has one: add --devices, "
                     "or run under mpirun/srun");
  if (settings.sync_batch_norm && !first().synced_layers()) throw UsageError("--sync-bn: the model has no batch norm");
  // One staged copy of each micro-batch where two do not fit on every device: the next batch is
  // then read once a step ends rather than while it runs.
  auto fit = [&] {
    auto device_plans = plans();
    for (size_t r = 0; r < device_plans.size(); ++r)
      if (!device_plans[r].fits(replicas_[r]->context())) return false;
    return true;
  };
  if (!fit())
    for (auto& replica : replicas_) replica->set_staging_slots(1);
}

std::vector<MemoryPlan> ReplicaGroup::plans() const {
  std::vector<MemoryPlan> plans;
  for (auto& replica : replicas_) plans.push_back(replica->plan());
  if (replicated()) {
    auto& allocator = replicas_.front()->context().allocator();
    for (auto& input : job_.staged)
      plans.front().add(allocator, "staging", static_cast<uint64_t>(element_count(input.shape)) * element_size(input.dtype),
                        vk::MemoryUsage::staging, "staged " + input.name);
  }
  return plans;
}

void ReplicaGroup::allocate() {
  for (auto& replica : replicas_) replica->allocate();
  if (replicated())
    for (auto& input : job_.staged)
      whole_.push_back(
          std::make_unique<Tensor>(first().context(), input.name, input.shape, input.dtype, vk::MemoryUsage::staging));
}

std::map<std::string, const Tensor*> ReplicaGroup::feed_target(int slot, int k) {
  if (!replicated()) return first().staged(slot, k);
  std::map<std::string, const Tensor*> target;
  for (size_t i = 0; i < whole_.size(); ++i) target[job_.staged[i].name] = whole_[i].get();
  return target;
}

void ReplicaGroup::distribute(int slot, int k, bool training) {
  if (!replicated()) {  // the feed wrote the replica's own staging: make it visible to the device
    for (auto& [name, tensor] : feed_target(slot, k)) tensor->buffer().flush();
    return;
  }
  uint32_t valid = 0;
  std::memcpy(&valid, whole_[valid_input_]->buffer().mapped(), 4);
  const auto* labels = static_cast<const uint32_t*>(whole_[labels_input_]->buffer().mapped());
  std::vector<double> weight(static_cast<size_t>(batch_));
  int64_t classes = first().classes();
  for (size_t n = 0; n < weight.size(); ++n)
    weight[n] = labels[n] >= classes                ? std::nan("")
                : settings_.class_weights.empty() ? 1.0
                                                  : settings_.class_weights[labels[n]];
  double batch_weight = 0;
  for (double w : weight) batch_weight += w;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    Replica& replica = *replicas_[r];
    BatchPart part = training ? replica.part()
                              : batch_part(valid, processes_.rank() * static_cast<int>(replicas_.size()) + static_cast<int>(r),
                                           replicas_in_job_);
    StagedBatch& staging = replica.staging(slot, k);
    for (size_t i = 0; i < whole_.size(); ++i) {
      if (i == valid_input_) continue;
      const Tensor& from = *whole_[i];
      const Tensor& to = *staging.inputs[i];
      uint64_t per_sample = from.bytes() / static_cast<uint64_t>(batch_);
      auto* destination = static_cast<uint8_t*>(to.buffer().mapped());
      std::memcpy(destination, static_cast<const uint8_t*>(from.buffer().mapped()) + part.first * per_sample,
                  part.count * per_sample);
      std::memset(destination + part.count * per_sample, 0, to.bytes() - part.count * per_sample);
      to.buffer().flush();
    }
    auto replica_valid = static_cast<uint32_t>(std::clamp<int64_t>(valid - part.first, 0, part.count));
    staging.inputs[valid_input_]->buffer().write(&replica_valid, 4);
    if (!training) continue;
    // The loss is a weighted mean over its samples: scaled by their share of the batch's weight,
    // the replicas' gradients sum to the one of the whole batch.
    double part_weight = 0;
    for (int64_t n = part.first; n < part.first + part.count; ++n) part_weight += weight[static_cast<size_t>(n)];
    auto scale = static_cast<float>(part_weight / batch_weight / settings_.accumulate);
    auto* loss_weight = static_cast<float*>(staging.loss_weight->buffer().mapped());
    std::fill(loss_weight, loss_weight + part.count, scale);
    staging.loss_weight->buffer().flush();
  }
}

void ReplicaGroup::run_micro_batch(int slot, size_t k) {
  auto micro_batch = static_cast<int>(k);
  size_t parts = first().micro_batch(slot, micro_batch).programs.size();
  for (size_t p = 0; p < parts; ++p) {
    for (auto& replica : replicas_) replica->micro_batch(slot, micro_batch).programs[p]->submit();
    if (p + 1 < parts) combine(slot, k, p);
  }
  if (k + 1 == static_cast<size_t>(settings_.accumulate))
    for (auto& replica : replicas_) replica->submit_backward_segments(slot);
}

// Batch norm moments (mean, M2 of n elements) merged by Chan et al.'s rule into the mean and
// biased variance of all elements; sums added.
void ReplicaGroup::combine(int slot, size_t k, size_t p) {
  auto micro_batch = static_cast<int>(k);
  std::vector<float*> values;
  std::vector<double> counts;
  for (auto& replica : replicas_) {
    auto& programs = replica->micro_batch(slot, micro_batch);
    programs.programs[p]->wait();
    programs.exchanges[p].host->buffer().invalidate();
    values.push_back(static_cast<float*>(programs.exchanges[p].host->buffer().mapped()));
    counts.push_back(static_cast<double>(programs.exchanges[p].count));
  }
  const auto& exchange = first().micro_batch(slot, micro_batch).exchanges[p];
  auto size = static_cast<size_t>(exchange.host->count());
  std::vector<double> combined(size, 0.0);
  if (exchange.combine == ReplicaSync::Combine::sum) {
    for (float* v : values)
      for (size_t i = 0; i < size; ++i) combined[i] += v[i];
    processes_.sum(combined);
  } else {
    size_t channels = size / 2;
    std::vector<double> weighted(channels + 1, 0.0);  // sum of n * mean per channel, then of n
    for (size_t r = 0; r < values.size(); ++r) {
      for (size_t c = 0; c < channels; ++c) weighted[c] += counts[r] * values[r][c];
      weighted[channels] += counts[r];
    }
    processes_.sum(weighted);
    double total = weighted[channels];
    for (size_t c = 0; c < channels; ++c) combined[c] = weighted[c] / total;
    std::vector<double> m2(channels, 0.0);
    for (size_t r = 0; r < values.size(); ++r)
      for (size_t c = 0; c < channels; ++c) {
        double d = values[r][c] - combined[c];
        m2[c] += values[r][channels + c] + counts[r] * d * d;
      }
    processes_.sum(m2);
    for (size_t c = 0; c < channels; ++c) combined[channels + c] = m2[c] / total;
  }
  for (float* v : values)
    for (size_t i = 0; i < size; ++i) v[i] = static_cast<float>(combined[i]);
  for (auto& replica : replicas_) replica->micro_batch(slot, micro_batch).exchanges[p].host->buffer().flush();
}

void ReplicaGroup::exchange_gradients(int slot) {
  auto& segments = first().segments();
  for (size_t s = 0; s < segments.size(); ++s) {
    // Each parameter's copies, replica by replica: summed in the replicas' order.
    std::vector<std::vector<std::span<float>>> copies;
    for (auto& replica : replicas_) {
      auto gradients = replica->segment_gradients(slot, s);
      copies.resize(gradients.size());
      for (size_t p = 0; p < gradients.size(); ++p) copies[p].push_back(gradients[p]);
    }
    auto before = Clock::now();
    for (auto& parameter : copies) sum_gradients(parameter, processes_);
    exchange_seconds += std::chrono::duration<double>(Clock::now() - before).count();
    exchange_bytes += segments[s].count * sizeof(float);
    for (auto& replica : replicas_) replica->flush_segment_gradients(s);  // the sums reach the devices
  }
  for (auto& replica : replicas_) replica->submit_update();
}

void ReplicaGroup::wait_all() {
  for (auto& replica : replicas_) replica->wait_all();
}

void ReplicaGroup::reset_metrics() {
  for (auto& replica : replicas_) replica->reset_metrics();
}

std::array<double, 3> ReplicaGroup::read_metrics() {
  std::array<double, 3> total{0, 0, 0};
  for (auto& replica : replicas_) {
    auto m = replica->read_metrics();
    for (size_t i = 0; i < 3; ++i) total[i] += m[i];
  }
  processes_.sum(std::span<double>(total));
  return total;
}

void ReplicaGroup::broadcast_state() {
  for (auto& [name, tensor] : first().state_tensors()) {
    std::vector<float> values = tensor->download();
    processes_.broadcast(values.data(), values.size() * sizeof(float));
    for (auto& replica : replicas_)
      if (replica.get() != replicas_.front().get() || processes_.rank() != 0)
        replica->state_tensors().at(name)->upload(values);
  }
}

uint64_t ReplicaGroup::peak_device_bytes() {
  double peak = 0;
  for (auto& replica : replicas_)
    peak = std::max(peak, static_cast<double>(replica->context().allocator().stats().peak_bytes));
  processes_.max(std::span<double>(&peak, 1));
  return static_cast<uint64_t>(peak);
}

double ReplicaGroup::replica_weight_difference(const std::map<std::string, HostArray>& params) {
  std::vector<float> reference;
  for (auto& [name, array] : params) reference.insert(reference.end(), array.values.begin(), array.values.end());
  std::vector<float> own = reference;
  processes_.broadcast(reference.data(), reference.size() * sizeof(float));
  double difference = 0;
  for (auto& replica : replicas_) {
    auto mine = replica.get() == replicas_.front().get() ? std::map<std::string, HostArray>{}
                                                          : download_tensors(replica->checkpoint_tensors());
    size_t i = 0;
    for (auto& [name, array] : params)
      for (size_t j = 0; j < array.values.size(); ++j, ++i) {
        float value = mine.empty() ? own[i] : mine.at(name).values[j];
        difference = std::max(difference, static_cast<double>(std::fabs(value - reference[i])));
      }
  }
  processes_.max(std::span<double>(&difference, 1));
  return difference;
}

BinaryScores ReplicaGroup::gather_scores(const BinaryScores& mine) {
  std::vector<double> packed;
  for (auto& [score, label] : mine.scored()) {
    packed.push_back(score);
    packed.push_back(label);
  }
  auto bytes = processes_.gather({reinterpret_cast<const uint8_t*>(packed.data()), packed.size() * sizeof(double)});
  std::vector<double> all(bytes.size() / sizeof(double));
  std::memcpy(all.data(), bytes.data(), bytes.size());
  BinaryScores scores;
  for (size_t i = 0; i + 1 < all.size(); i += 2) scores.add(all[i], static_cast<uint32_t>(all[i + 1]));
  return scores;
}

void ReplicaGroup::check_processes_agree(const std::vector<double>& counts) {
  std::vector<double> largest = counts, negated = counts;
  for (auto& value : negated) value = -value;
  processes_.max(largest);
  processes_.max(negated);
  for (size_t i = 0; i < counts.size(); ++i)
    if (largest[i] != -negated[i])
      throw BadInput("the processes of the MPI job see different runs (steps per epoch, validation batches, first "
                     "epoch, gradient size: this one has " + std::to_string(static_cast<int64_t>(counts[0])) + ", " +
                     std::to_string(static_cast<int64_t>(counts[1])) + ", " + std::to_string(static_cast<int64_t>(counts[2])) +
                     ", " + std::to_string(static_cast<int64_t>(counts[3])) +
                     "): every process must read the same --data, model and checkpoint");
}

}  // namespace tessera
